"""One call from raw rows to training rows: tokenize (samples.py), then pack or bucket (pack.py)."""

import datasets

from train.data.pack import pack_samples
from train.data.samples import tokenize_rows


def pad_id(tokenizer) -> int:
    """Padding id: pad, else eos, else 0. Padding is never supervised."""
    for tok_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tok_id is not None:
            return int(tok_id)
    return 0


def build_dataset(
    rows: datasets.Dataset,
    tokenizer,
    seq_len: int,
    *,
    packing: str = "pack",
    seed: int = 0,
    chat_template: str | None = None,
    template_kwargs: dict | None = None,
    on_bad_row: str = "skip",
    long_sample: str = "truncate",
    num_proc: int | None = None,
    report=None,
) -> datasets.Dataset:
    """Raw rows -> Dataset of `[seq_len]` rows with `input_ids`, `loss_mask`, `position_ids`,
    `doc_ids` (contract in pack.py). `packing` is "pack" or "bucket"; deterministic given `seed`.
    `num_proc` processes tokenize; packing stays in one, since each process would pack its own
    shard's windows apart: the rows are the same whatever `num_proc`.
    `report` (a `DataReport`) collects what was dropped or changed, per reason."""
    samples = tokenize_rows(
        rows,
        tokenizer,
        chat_template=chat_template,
        template_kwargs=template_kwargs,
        on_bad_row=on_bad_row,
        report=report,
        num_proc=num_proc,
    )
    return pack_samples(
        samples,
        seq_len,
        pad_token_id=pad_id(tokenizer),
        mode=packing,
        seed=seed,
        long_sample=long_sample,
        report=report,
    )
