"""`python -m train.publish.calibrate CKPT_DIR --target PATH [--data FILE] [--objective sequential]
[--fold-into-weights]`: STS calibration of the confidence head, one temperature per draft slot
fitted on held-out data.

For every sampled anchor block of the held-out set it computes the head's logit z_k and the
realised per-slot acceptance 1 - TV(p_draft, p_target) (the quantity the head is trained on).
`--objective sequential` (default, the paper's): the temperatures jointly minimise the BCE of the
survival prod_{i<=k} sigmoid(z_i / T_i) against the prefix acceptance prod_{i<=k} (1 - TV_i);
`per_slot`: T_k minimises BCE(sigmoid(z_k / T_k), 1 - TV_k) alone. Fit on even blocks, ECE
reported on odd blocks (held out), before and after, both of survivals against prefix
acceptance ("sequential", what the scheduler consumes) and of c_k against 1 - TV_k ("per_slot").
Writes CKPT/confidence_calibration.json, which the embedded engine reads.

vLLM 0.34 reads no temperature (no config key; its head is sigmoid(proj(x))). `--fold-into-weights`
also fits one shared temperature on the same objective and divides the checkpoint's
`confidence_head.proj` weight and bias by it, so vLLM serves calibrated-by-T confidences; the
file then keeps the per-slot remainder T_k / T (the engine's composition stays z / T_k).
Prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf
from safetensors import safe_open
from safetensors.torch import save_file

from common.checkpoint import WEIGHTS_NAME, load_checkpoint
from common.sampling.calibration import (
    CALIBRATION_NAME,
    FOLDED_TEMPERATURE_KEY,
    expected_calibration_error,
    fit_sequential_temperatures,
    fit_temperature,
    fold_temperature,
    sequential_ece,
)
from common.target import TargetCapture, target_head_weights
from train.data import build_dataloader
from train.data.splits import build_split
from train.loop.blocks import anchor_blocks, capture_batch
from train.loop.loss import block_acceptance
from train.loop.target import load_target
from train.schema import LossCfg


@torch.no_grad()
def collect(
    draft,
    target,
    tok,
    data: str,
    seq_len: int,
    max_rows: int,
    anchors: int,
    seed: int,
    max_bad_row_share: float = 0.05,
):
    """-> (logits [M, Nd], accept [M, Nd], mask [M, Nd]) over all held-out anchor blocks."""
    dcfg = OmegaConf.create(
        {
            "split": None,
            "seq_len": seq_len,
            "packing": "pack",
            "chat_template": None,
            "on_bad_row": "error",
            "max_bad_row_share": max_bad_row_share,
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


OBJECTIVES = ("sequential", "per_slot")


def per_slot_temperatures(z, acc, mask) -> torch.Tensor:
    temps = []
    for k in range(z.shape[1]):
        m = mask[:, k]
        temps.append(fit_temperature(z[m, k], acc[m, k]) if m.sum() >= 8 else 1.0)
    return torch.tensor(temps, dtype=torch.float64)


def per_slot_ece(z, acc, mask, t) -> list[float]:
    return [
        expected_calibration_error(torch.sigmoid(z[mask[:, k], k] / t[k]), acc[mask[:, k], k])
        for k in range(z.shape[1])
    ]


def calibrate(z, acc, mask, objective: str = "sequential") -> dict:
    """Fit on even-indexed blocks, report ECE on the odd-indexed ones (held out from the fit),
    so the before/after numbers are not in-sample. Also fits the shared temperature (the one
    `--fold-into-weights` folds) on the same objective."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r}: choose one of {OBJECTIVES}")
    fit = torch.arange(z.shape[0]) % 2 == 0
    zf, af, mf = z[fit].double(), acc[fit].double(), mask[fit]
    ze, ae, me = z[~fit].double(), acc[~fit].double(), mask[~fit]
    if objective == "sequential":
        temps = fit_sequential_temperatures(zf, af, mf)
    else:
        temps = per_slot_temperatures(zf, af, mf)
    shared = fit_sequential_temperatures(zf, af, mf, shared=True)
    one = torch.ones_like(temps)
    return {
        "method": "sts",
        "objective": objective,
        "loss": "BCE of prod_{i<=k} sigmoid(z_i/T_i) vs prod_{i<=k} (1 - TV_i)"
        if objective == "sequential"
        else "BCE of sigmoid(z_k/T_k) vs 1 - TV_k",
        "temperatures": temps.tolist(),
        "shared_temperature": float(shared[0]),
        "ece_before": sequential_ece(ze, ae, me, one),
        "ece_after": sequential_ece(ze, ae, me, temps),
        "ece_after_shared": sequential_ece(ze, ae, me, shared),
        "per_slot_ece_before": per_slot_ece(ze, ae, me, one),
        "per_slot_ece_after": per_slot_ece(ze, ae, me, temps),
        "num_eval_samples": [int(me[:, k].sum()) for k in range(z.shape[1])],
    }


def fold_into_weights(ckpt_dir: Path, result: dict) -> dict:
    """Divide the checkpoint's confidence head by the shared temperature (what vLLM reads) and
    keep the per-slot remainder in the result. Refuses a checkpoint already folded."""
    path = Path(ckpt_dir) / WEIGHTS_NAME
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open: no __iter__)
    if FOLDED_TEMPERATURE_KEY in meta:
        raise ValueError(
            f"{path}: a temperature {meta[FOLDED_TEMPERATURE_KEY]} is already "
            "folded into the confidence head; calibrate the unfolded checkpoint instead"
        )
    t = result["shared_temperature"]
    w, b = "confidence_head.proj.weight", "confidence_head.proj.bias"
    tensors[w], tensors[b] = fold_temperature(tensors[w], tensors[b], t)
    meta = {**meta, FOLDED_TEMPERATURE_KEY: repr(t)}
    save_file(tensors, str(path), metadata=meta)
    out = dict(result)
    out["folded_temperature"] = t
    out["unfolded_temperatures"] = result["temperatures"]
    out["temperatures"] = [tk / t for tk in result["temperatures"]]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.publish.calibrate", description=__doc__)
    ap.add_argument("ckpt_dir")
    ap.add_argument("--target", required=True, help="the target the draft was trained against")
    ap.add_argument("--data", help="held-out rows (default TARGET/data/heldout.jsonl)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--max-rows", type=int, default=256)
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument(
        "--max-bad-row-share",
        type=float,
        default=0.05,
        help="rows without a supervised token in --seq-len (a long prompt) are dropped and "
        "counted; a larger share stops (raise it for chat data with long prompts)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--objective", choices=OBJECTIVES, default="sequential")
    ap.add_argument(
        "--fold-into-weights",
        action="store_true",
        help="divide the confidence head by the shared temperature (vLLM reads only weights)",
    )
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
    z, acc, mask = collect(
        draft, target, tok, data, a.seq_len, a.max_rows, a.anchors, a.seed, a.max_bad_row_share
    )
    result = calibrate(z, acc, mask, a.objective)
    if a.fold_into_weights:
        result = fold_into_weights(Path(a.ckpt_dir), result)
    (Path(a.ckpt_dir) / CALIBRATION_NAME).write_text(json.dumps(result, indent=2) + "\n")
    print(f"objective: {result['loss']}; shared T = {result['shared_temperature']:.3f}")
    print(
        "| slot | eval samples | T | survival ECE before | after | after (shared T) "
        "| per-slot ECE before | after |\n|---|---|---|---|---|---|---|---|"
    )
    temps = result.get("unfolded_temperatures", result["temperatures"])
    for k, t in enumerate(temps):
        r = result
        print(
            f"| {k} | {r['num_eval_samples'][k]} | {t:.3f} | {r['ece_before'][k]:.4f} | "
            f"{r['ece_after'][k]:.4f} | {r['ece_after_shared'][k]:.4f} | "
            f"{r['per_slot_ece_before'][k]:.4f} | {r['per_slot_ece_after'][k]:.4f} |"
        )
    if a.fold_into_weights:
        print(f"folded T = {result['folded_temperature']:.3f} into {WEIGHTS_NAME}")
    print(f"wrote {Path(a.ckpt_dir) / CALIBRATION_NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
