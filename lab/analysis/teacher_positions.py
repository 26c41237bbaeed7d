"""How often the supervised draft rows of real training batches share a teacher position: the
blocks of nearby anchors overlap, so their rows read the target's distribution at the same
positions, and the loss computes it once per distinct position (`loss.share_teacher`,
train/loop/vocab_loss.py). Prints, per `num_anchors`, the rows, the distinct positions and their
ratio (the share of the per-row teacher work that is left), on the trainer's own packed rows and
anchors.

    python lab/analysis/teacher_positions.py --target artifacts/smollm2-135m-instruct \
        --data artifacts/smollm2-data/train.mix.jsonl --experiment smollm2_dspark_16k \
        --max-rows 2000 --batches 4 --anchors 256 512 1024
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.config import DSparkConfig  # noqa: E402
from lab import SEARCHPATH  # noqa: E402
from train.config_io import compose_config  # noqa: E402
from train.data import collate  # noqa: E402
from train.data.splits import build_split  # noqa: E402
from train.loop.blocks import anchor_blocks  # noqa: E402
from train.loop.vocab_loss import shared_teacher_counts  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="the target's HF directory")
    ap.add_argument("--data", required=True, help="training rows (JSONL chat rows)")
    ap.add_argument("--experiment", default="smollm2_dspark_16k")
    ap.add_argument("--max-rows", type=int, default=2000, help="source rows to pack")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--anchors", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args(argv)
    from transformers import AutoConfig, AutoTokenizer

    cfg = compose_config(
        [SEARCHPATH, f"+experiment={a.experiment}", f"target.path={a.target}", "data.num_proc=1"]
    )
    tok = AutoTokenizer.from_pretrained(a.target)
    ds = build_split(cfg.data, a.data, tok, cfg.seed, a.max_rows)
    dcfg = DSparkConfig.from_target(  # which positions blocks read: the block size decides
        AutoConfig.from_pretrained(a.target),
        mask_token_id=0,
        block_size=int(cfg.draft.block_size),
    )
    t2d = torch.ones(dcfg.vocab_size, dtype=torch.bool)
    mb, seq = cfg.trainer.micro_batch_size, cfg.data.seq_len
    cols = ["input_ids", "loss_mask", "position_ids", "doc_ids"]
    table = []
    for anchors in a.anchors:
        rows = positions = 0
        for b in range(a.batches):
            batch = collate(ds.with_format("numpy", columns=cols)[b * mb : (b + 1) * mb])
            _, _, tg = anchor_blocks(batch, dcfg, t2d, anchors, cfg.seed, b, cfg.loss.decay)
            r, p = shared_teacher_counts(tg, seq)
            rows, positions = rows + r, positions + p
        table.append(
            {
                "num_anchors": anchors,
                "seq_len": seq,
                "sequences": a.batches * mb,
                "supervised_rows": rows,
                "teacher_positions": positions,
                "positions_per_row": positions / rows,
            }
        )
    print("| num_anchors | seq_len | sequences | supervised rows | teacher positions | ratio |")
    print("|---|---|---|---|---|---|")
    for r in table:
        print(
            f"| {r['num_anchors']} | {r['seq_len']} | {r['sequences']} | {r['supervised_rows']} "
            f"| {r['teacher_positions']} | {r['positions_per_row']:.3f} |"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
