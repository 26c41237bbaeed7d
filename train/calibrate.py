"""`python -m train.calibrate CKPT_DIR --target PATH [--data FILE]`: STS calibration of the
confidence head, i.e. one temperature per draft slot fitted on held-out data.

For every sampled anchor block of the held-out set it computes the head's logit z_k and the
realised per-slot acceptance 1 - TV(p_draft, p_target) (the quantity the head is trained on), fits
T_k by minimising BCE(sigmoid(z_k / T_k), 1 - TV_k), and writes CKPT/confidence_calibration.json
with the temperatures and the per-position ECE before and after. The embedded engine's adaptive
scheduler applies them (common/sampling/calibration.py). Prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from common.checkpoint import load_checkpoint
from common.sampling.calibration import (
    CALIBRATION_NAME,
    expected_calibration_error,
    fit_temperature,
)
from common.target import TargetCapture, target_head_weights
from train.blocks import anchor_blocks, capture_batch
from train.data import build_dataloader
from train.loss import block_acceptance
from train.schema import LossCfg
from train.setup import build_split, load_target


@torch.no_grad()
def collect(draft, target, tok, data: str, seq_len: int, max_rows: int, anchors: int, seed: int):
    """-> (logits [M, Nd], accept [M, Nd], mask [M, Nd]) over all held-out anchor blocks."""
    dcfg = OmegaConf.create(
        {
            "split": None,
            "seq_len": seq_len,
            "packing": "pack",
            "chat_template": None,
            "on_bad_row": "error",
        }
    )
    ds = build_split(dcfg, data, tok, seed, max_rows)
    capture = TargetCapture(target, draft.config.target_layer_ids, check_finite=True)
    head = target_head_weights(target)[1]
    dev = next(draft.parameters()).device
    zs, accs, masks = [], [], []
    for batch in build_dataloader(ds, 4, seed=seed, shuffle=False, drop_last=False):
        batch = {k: v.to(dev) for k, v in batch.items()}
        cap = capture_batch(capture, batch)
        a, v, tg = anchor_blocks(batch, draft.config, draft.t2d, anchors, seed, -1, LossCfg().decay)
        fo = draft.forward_train(
            cap.aux, batch["input_ids"], a, v, batch["position_ids"], batch["doc_ids"]
        )
        acc = block_acceptance(draft, fo, tg, cap.final, head)
        z = draft.confidence_head.logits(fo.hidden, fo.markov_embed)
        nd = tg.labels.shape[-1]
        zs.append(z.reshape(-1, nd).float().cpu())
        accs.append(acc.reshape(-1, nd).float().cpu())
        masks.append(tg.mask.reshape(-1, nd).bool().cpu())
    return torch.cat(zs), torch.cat(accs), torch.cat(masks)


def calibrate(z, acc, mask) -> dict:
    """Fit T_k on even-indexed blocks, report ECE on the odd-indexed ones (held out from the
    fit), so the before/after numbers are not in-sample."""
    fit = torch.arange(z.shape[0]) % 2 == 0
    temps, before, after, counts = [], [], [], []
    for k in range(z.shape[1]):
        m_fit, m_eval = mask[:, k] & fit, mask[:, k] & ~fit
        t = fit_temperature(z[m_fit, k], acc[m_fit, k]) if m_fit.sum() >= 8 else 1.0
        zk, ak = z[m_eval, k], acc[m_eval, k]
        temps.append(t)
        before.append(expected_calibration_error(torch.sigmoid(zk), ak))
        after.append(expected_calibration_error(torch.sigmoid(zk / t), ak))
        counts.append(int(m_eval.sum()))
    return {
        "method": "sts",
        "temperatures": temps,
        "ece_before": before,
        "ece_after": after,
        "num_eval_samples": counts,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.calibrate", description=__doc__)
    ap.add_argument("ckpt_dir")
    ap.add_argument("--target", required=True, help="the target the draft was trained against")
    ap.add_argument("--data", help="held-out rows (default TARGET/data/heldout.jsonl)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--max-rows", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    tcfg = OmegaConf.create(
        {"path": a.target, "dtype": "auto", "build_tiny": False, "trust_remote_code": False}
    )
    target, tok = load_target(tcfg, dev)
    embed, head = target_head_weights(target)
    draft = load_checkpoint(a.ckpt_dir, device=dev, target_embed=embed, target_lm_head=head)
    draft = draft.eval()
    if draft.confidence_head is None:
        print(f"{a.ckpt_dir}: no confidence head to calibrate", file=sys.stderr)
        return 2
    data = a.data or str(Path(a.target) / "data" / "heldout.jsonl")
    z, acc, mask = collect(draft, target, tok, data, a.seq_len, a.max_rows, a.anchors, a.seed)
    result = calibrate(z, acc, mask)
    (Path(a.ckpt_dir) / CALIBRATION_NAME).write_text(json.dumps(result, indent=2) + "\n")
    print("| slot | eval samples | T | ECE before | ECE after |\n|---|---|---|---|---|")
    for k, t in enumerate(result["temperatures"]):
        print(
            f"| {k} | {result['num_eval_samples'][k]} | {t:.3f} | {result['ece_before'][k]:.4f} | "
            f"{result['ece_after'][k]:.4f} |"
        )
    print(f"wrote {Path(a.ckpt_dir) / CALIBRATION_NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
