"""Data side of distillation: raw rows -> masked, packed rows -> resumable sharded batches.

Pipeline (one module per step):
    sources.load_rows        hub id or local jsonl/json/parquet/arrow -> Dataset of raw rows
    jsonl                    after a failed load: drop (and count) jsonl lines that do not parse
    rows / render            validate a row; render chat (assistant-only mask) or text (all ones)
    spans                    assistant tokens of a template without generation markers
    samples.tokenize_rows    batched map -> variable-length (input_ids, loss_mask, row_index)
    report.DataReport        rows and turns dropped or changed, per reason; the bad-share gate
    pack.pack_samples        -> fixed [seq_len] rows (pack or bucket) with position_ids, doc_ids
    build.build_dataset      tokenize_rows + pack_samples in one call
    loader.build_dataloader  resumable, rank-sharded DataLoader of [B, seq_len] tensors
    counts.count_loss_tokens per-id counts of supervised tokens, for the reduced draft vocab
    regenerate               optional: replace final assistant turns with the target's answers
"""

from train.data.build import build_dataset, pad_id
from train.data.counts import count_loss_tokens, dataset_stats
from train.data.loader import (
    ResumableDataLoader,
    build_dataloader,
    collate,
    document_causal_mask,
)
from train.data.pack import pack_samples
from train.data.render import ChatTemplateError, Renderer, load_chat_template
from train.data.report import BadDataShare, DataReport
from train.data.rows import BadRowError, normalize_row
from train.data.sampler import epoch_order, rank_batches
from train.data.samples import tokenize_rows
from train.data.sources import load_rows

__all__ = [
    "BadDataShare",
    "BadRowError",
    "ChatTemplateError",
    "DataReport",
    "Renderer",
    "ResumableDataLoader",
    "build_dataloader",
    "build_dataset",
    "collate",
    "count_loss_tokens",
    "dataset_stats",
    "document_causal_mask",
    "epoch_order",
    "load_chat_template",
    "load_rows",
    "normalize_row",
    "pack_samples",
    "pad_id",
    "rank_batches",
    "tokenize_rows",
]
