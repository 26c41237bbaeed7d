"""Tokenize a Dataset of raw rows into variable-length samples `(input_ids, loss_mask, row_index)`.

Runs as a batched `Dataset.map`, so the result is cached by datasets fingerprinting when the
input is file-backed (offline is fine: nothing is fetched). `row_index` is the row's position in
the dataset passed in, the same index error messages use.

`on_bad_row="skip"` (default) drops turns with empty content or an unknown role, drops rows that
are still unusable (malformed, no assistant turn, rejected by the template), and counts both per
reason into a `DataReport`; `"error"` raises `BadRowError` at the first problem. `ChatTemplateError`
(the template cannot mark assistant tokens) is never skipped: it is a config error.
"""

import hashlib
import logging
from collections import Counter
from pathlib import Path

import datasets
from datasets import Features, List, Value

from train.data.render import Renderer
from train.data.report import BadDataShare, DataReport
from train.data.rows import BadRowError

log = logging.getLogger(__name__)

# datasets' cache key holds the map function and its arguments, but the Renderer is pickled by
# reference: hashing the rendering code's source keeps a cached tokenization from outliving it.
RENDER_CODE = hashlib.sha256(
    b"".join((Path(__file__).parent / f).read_bytes() for f in ("render.py", "spans.py", "rows.py"))
).hexdigest()

ON_BAD_ROW = ("skip", "error")

SAMPLE_FEATURES = Features(
    {
        "input_ids": List(Value("int32")),
        "loss_mask": List(Value("bool")),
        "row_index": Value("int64"),
        "error": Value("string"),
        "reason": Value("string"),
        "notes": List(Value("string")),
    }
)


def _render_batch(
    batch: dict, indices: list[int], renderer: Renderer, skip: bool, code: str = ""
) -> dict:
    keys = list(batch)
    out = {k: [] for k in SAMPLE_FEATURES}
    for j, index in enumerate(indices):
        row = {k: batch[k][j] for k in keys}
        try:
            r = renderer.render(row, index)
            ids, mask, notes, error, reason = r.ids, r.mask, r.notes, None, None
        except BadRowError as e:
            if not skip:
                raise BadRowError(
                    e.index,
                    f"{e.problem} (set data.on_bad_row=skip to drop such rows)",
                    e.reason,
                ) from None
            ids, mask, notes, error, reason = [], [], [], e.problem, e.reason
        out["input_ids"].append(ids)
        out["loss_mask"].append(mask)
        out["row_index"].append(index)
        out["error"].append(error)
        out["reason"].append(reason)
        out["notes"].append(notes)
    return out


def tokenize_rows(
    rows: datasets.Dataset,
    tokenizer,
    *,
    chat_template: str | None = None,
    template_kwargs: dict | None = None,
    on_bad_row: str = "skip",
    report: DataReport | None = None,
    num_proc: int | None = None,
    batch_size: int = 256,
) -> datasets.Dataset:
    """Return a Dataset with columns `input_ids` (int32 list), `loss_mask` (bool list, same length),
    `row_index` (int64). `chat_template` is an override: a .jinja path or inline template.
    Dropped rows and turns are counted into `report` (rows read are added to `report.rows`)."""
    if on_bad_row not in ON_BAD_ROW:
        raise ValueError(f"on_bad_row must be one of {ON_BAD_ROW}, got {on_bad_row!r}")
    skip = on_bad_row == "skip"
    renderer = Renderer(tokenizer, chat_template, template_kwargs, drop_bad_turns=skip)
    rendered = rows.map(
        _render_batch,
        batched=True,
        batch_size=batch_size,
        with_indices=True,
        fn_kwargs={"renderer": renderer, "skip": skip, "code": RENDER_CODE},
        remove_columns=rows.column_names,
        features=SAMPLE_FEATURES,
        num_proc=num_proc,
        desc="tokenize",
    )
    report = report if report is not None else DataReport()
    report.rows += len(rows)
    _count(rendered, report)
    if report.dropped:
        rendered = rendered.filter(
            lambda e: [x is None for x in e], input_columns="error", batched=True
        )
    if len(rendered) == 0:
        detail = "; ".join(line.strip() for line in report.lines()[1:])
        raise BadDataShare(f"{report.source}: no usable rows out of {len(rows)}: {detail}")
    return rendered.remove_columns(["error", "reason", "notes"])


def _count(rendered: datasets.Dataset, report: DataReport) -> None:
    reasons = rendered["reason"]
    bad = [i for i, r in enumerate(reasons) if r is not None]
    for r in rendered.select(bad).select_columns(["row_index", "error", "reason"]):
        report.drop(r["reason"], f"row {r['row_index']}: {r['error']}")
    for reason, n in Counter(x for notes in rendered["notes"] for x in notes).items():
        report.note(reason, n)
    if report.dropped:
        log.warning(
            "skipped %d of %d rows as unusable (first: %s)",
            report.bad_rows,
            report.rows,
            "; ".join(list(report.examples.values())[:3]),
        )
