"""Tokenize a Dataset of raw rows into variable-length samples `(input_ids, loss_mask, row_index)`.

Runs as a batched `Dataset.map`, so the result is cached by datasets fingerprinting when the
input is file-backed (offline is fine: nothing is fetched). `row_index` is the row's position in
the dataset passed in, the same index error messages use.

`on_bad_row="error"` (default) raises `BadRowError` at the first malformed row; `"skip"` drops such
rows and logs one warning with their count and the first few problems. `ChatTemplateError` (the
template cannot mark assistant tokens) is never skipped: it is a config error.
"""

import logging

import datasets
from datasets import Features, List, Value

from train.data.render import Renderer
from train.data.rows import BadRowError

log = logging.getLogger(__name__)

SAMPLE_FEATURES = Features(
    {
        "input_ids": List(Value("int32")),
        "loss_mask": List(Value("bool")),
        "row_index": Value("int64"),
        "error": Value("string"),
    }
)


def _render_batch(batch: dict, indices: list[int], renderer: Renderer, skip: bool) -> dict:
    keys = list(batch)
    out = {"input_ids": [], "loss_mask": [], "row_index": [], "error": []}
    for j, index in enumerate(indices):
        row = {k: batch[k][j] for k in keys}
        try:
            ids, mask = renderer(row, index)
            error = None
        except BadRowError as e:
            if not skip:
                raise BadRowError(
                    e.index, f"{e.problem} (set data.on_bad_row=skip to drop such rows)"
                ) from None
            ids, mask, error = [], [], e.problem
        out["input_ids"].append(ids)
        out["loss_mask"].append(mask)
        out["row_index"].append(index)
        out["error"].append(error)
    return out


def tokenize_rows(
    rows: datasets.Dataset,
    tokenizer,
    *,
    chat_template: str | None = None,
    on_bad_row: str = "error",
    num_proc: int | None = None,
    batch_size: int = 256,
) -> datasets.Dataset:
    """Return a Dataset with columns `input_ids` (int32 list), `loss_mask` (bool list, same length),
    `row_index` (int64). `chat_template` is an override: a .jinja path or inline template."""
    if on_bad_row not in ("error", "skip"):
        raise ValueError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    renderer = Renderer(tokenizer, chat_template)
    rendered = rows.map(
        _render_batch,
        batched=True,
        batch_size=batch_size,
        with_indices=True,
        fn_kwargs={"renderer": renderer, "skip": on_bad_row == "skip"},
        remove_columns=rows.column_names,
        features=SAMPLE_FEATURES,
        num_proc=num_proc,
        desc="tokenize",
    )
    if on_bad_row == "skip":
        rendered = _drop_bad(rendered, len(rows))
    if len(rendered) == 0:
        raise ValueError(f"no usable rows out of {len(rows)}; see the warnings above")
    return rendered.remove_columns("error")


def _drop_bad(rendered: datasets.Dataset, num_rows: int) -> datasets.Dataset:
    bad = rendered.filter(lambda e: [x is not None for x in e], input_columns="error", batched=True)
    if len(bad):
        examples = "; ".join(
            f"row {r['row_index']}: {r['error']}" for r in bad.select(range(min(3, len(bad))))
        )
        log.warning("skipped %d of %d rows as malformed (first: %s)", len(bad), num_rows, examples)
        rendered = rendered.filter(
            lambda e: [x is None for x in e], input_columns="error", batched=True
        )
    return rendered
