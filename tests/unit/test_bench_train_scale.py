"""The shaped trainer-step benchmark's plumbing at a tiny shape on CPU (seconds)."""

import argparse

import pytest
import torch

from scripts import bench_train_scale as bts

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def test_random_target_is_finite_and_tied_where_the_shape_says():
    m = bts.build_target("tiny", torch.device("cpu"), torch.float32)
    rot = next(mod for mod in m.modules() if type(mod).__name__.endswith("RotaryEmbedding"))
    assert torch.isfinite(rot.inv_freq).all() and rot.inv_freq.max() == 1.0
    out = m(torch.randint(0, 500, (1, 16))).logits
    assert torch.isfinite(out).all() and out.std() > 0
    assert m.get_input_embeddings().weight.data_ptr() != m.get_output_embeddings().weight.data_ptr()


def test_synthetic_rows_are_packed_documents_with_a_prompt_mask():
    ds = bts.synthetic_rows(512, 3000, 2, seed=1).with_format("torch")
    row = ds[0]
    starts = (row["position_ids"] == 0).nonzero().squeeze(1)
    assert len(starts) >= 2  # documents of <= 2048 tokens in a 3000-token row
    assert not row["loss_mask"][starts].any()  # never the first token of a document
    assert (row["doc_ids"].diff() >= 0).all() and 0.5 < row["loss_mask"].float().mean() < 0.8


def test_step8b_runs_the_trainer_on_the_same_batches_for_every_variant():
    ap = argparse.ArgumentParser()
    bts.add_parser(ap.add_subparsers(dest="part"))
    per_row = "fused_loss+loss.share_teacher=false"
    a = ap.parse_args(["step8b", "--shape", "tiny", "--device", "cpu", "--steps", "1"])
    a.warmup, a.no_matmul = 1, True
    a.variants = ["checkpoint_loss", "fused_loss", per_row]
    res = bts.bench_scale(a)
    rows = {r["variant"]: r for r in res["rows"]}
    assert set(rows) == {"checkpoint_loss", "fused_loss", per_row}
    for r in rows.values():
        assert r["tokens_per_s"] > 0 and r["tokens_per_step"] == 2 * 128
        assert r["target_forward_ms"] > 0 and r["backward_ms"] > 0 and r["teacher_logits_ms"] > 0
        split = r["flops_split_tflop"]
        assert split["total"] == pytest.approx(sum(v for k, v in split.items() if k != "total"))
    # First step, before any update: the same data, anchors and draft init in both variants
    # (their gradients are compared in float64 in tests/unit/test_train_loss.py).
    f, c, p = rows["fused_loss"], rows["checkpoint_loss"], rows[per_row]
    for other in (c, p):
        assert f["first_step_loss"] == pytest.approx(other["first_step_loss"], rel=1e-6)
        assert f["first_step_grad_norm"] == pytest.approx(other["first_step_grad_norm"], rel=1e-4)
    # The teacher once per shared position: fewer teacher rows, and fewer FLOPs counted for them.
    assert f["teacher_rows_per_supervised_row"] < 1 == p["teacher_rows_per_supervised_row"]
    assert f["flops_split_tflop"]["teacher"] < p["flops_split_tflop"]["teacher"]
