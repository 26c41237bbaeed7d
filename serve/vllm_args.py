"""The `vllm serve` command for a DSpark draft, and every decision it rests on.

Design choices (docs/vllm-contract.md, checked against vLLM 0.34.0's source):
- Pure functions of plain values (the checkpoint's `DSparkConfig`, launch settings, environment):
  tests cover each decision without vLLM or a GPU. `serve.launch` probes the machine and execs.
- A setting vLLM 0.34 would reject at startup, or would accept and then serve silently wrong
  (a gated/rnn Markov head: vLLM's loader refuses it), raises `LaunchRefused`; the launcher
  exits 2.
- `"model"` and `num_speculative_tokens` are always explicit in `--speculative-config`: without the
  first vLLM drafts with the target checkpoint itself (`DSparkSpeculatorConfig.default_model`);
  the second defaults to `block_size`, one slot too many for a 1+N draft.
- `--enable-batch-sharded-sampling` is only passed when vLLM's `_validate_batch_sharded_sampling`
  would accept it: vLLM raises, rather than falls back, when the flag is set and a precondition
  fails.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from common.config import DSparkConfig

PINNED_VLLM = "vllm>=0.34,<0.35"  # the seed's release: every feature below
SERVABLE_VLLM = "vllm>=0.25,<0.35"  # has the dspark speculator; older ones lack some features
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")
# vLLM's default max_num_seqs on CUDA is 256 (1024 on >= 70 GB GPUs): never below a sane TP size.
VLLM_DEFAULT_MAX_NUM_SEQS = 256
VLLM_DEFAULT_MAX_LOGPROBS = 20
# Target classes of vLLM 0.34 with `compute_logits_local` (subclasses inherit it). Without it
# vLLM logs "Disabling batch-sharded sampling" and keeps everything replicated.
TARGETS_WITH_LOCAL_LOGITS = frozenset(
    {
        "Qwen3ForCausalLM",
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "GptOssForCausalLM",
        "Qwen3_5ForConditionalGeneration",
    }
)
# Flags this launcher sets from its own config keys; passing them in extra_vllm_args is refused.
MANAGED_FLAGS = {
    "--speculative-config": "num_speculative_tokens / draft_sampling / adaptive_verification",
    "-sc": "num_speculative_tokens / draft_sampling / adaptive_verification",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--enable-batch-sharded-sampling": "batch_sharded_sampling",
    "--no-enable-batch-sharded-sampling": "batch_sharded_sampling",
    "--max-num-seqs": "max_num_seqs",
    "--max-model-len": "max_model_len",
    "--max-logprobs": "max_logprobs",
    "--enforce-eager": "enforce_eager",
    "--host": "host",
    "--port": "port",
    "--served-model-name": "served_model_name",
    "--dtype": "dtype",
    "--seed": "seed",
}


class LaunchRefused(ValueError):
    """A launch that must not happen; the message says what to change."""


# ---------------------------------------------------------------- command builder


@dataclass(frozen=True)
class VllmServeArgs:
    """Resolved inputs of `vllm serve`. `checkpoint=None` serves the target without drafting."""

    target: str
    checkpoint: str | None
    num_speculative_tokens: int | None = None
    draft_sample_method: str = "probabilistic"
    enable_adaptive_verification: bool = False
    attention_backend: str | None = None
    tensor_parallel_size: int = 1
    draft_tensor_parallel_size: int | None = None
    enable_batch_sharded_sampling: bool = False
    host: str | None = None
    port: int | None = None
    served_model_name: str | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    max_logprobs: int | None = None
    enforce_eager: bool = False
    dtype: str | None = None
    seed: int | None = None
    extra_args: tuple[str, ...] = ()


def speculative_config(a: VllmServeArgs) -> dict | None:
    """The `--speculative-config` JSON object, or None for a baseline (no draft)."""
    if a.checkpoint is None:
        return None
    spec = {
        "method": "dspark",
        "model": a.checkpoint,
        "num_speculative_tokens": a.num_speculative_tokens,
        "draft_sample_method": a.draft_sample_method,
    }
    if a.enable_adaptive_verification:
        spec["enable_adaptive_verification"] = True
    if a.attention_backend:
        spec["attention_backend"] = a.attention_backend
    if a.draft_tensor_parallel_size is not None:
        spec["draft_tensor_parallel_size"] = a.draft_tensor_parallel_size
    return spec


def build_vllm_command(a: VllmServeArgs, executable: Sequence[str] = ("vllm",)) -> list[str]:
    """argv of `vllm serve TARGET ...` (the speculative config is validated first)."""
    cmd = [*executable, "serve", a.target]
    spec = speculative_config(a)
    if spec is not None:
        check_speculative_config(spec)
        cmd += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    cmd += ["-tp", str(a.tensor_parallel_size)]
    if a.enable_batch_sharded_sampling:
        cmd.append("--enable-batch-sharded-sampling")
    for flag, value in (
        ("--host", a.host),
        ("--port", a.port),
        ("--served-model-name", a.served_model_name),
        ("--max-num-seqs", a.max_num_seqs),
        ("--max-model-len", a.max_model_len),
        ("--max-logprobs", a.max_logprobs),
        ("--dtype", a.dtype),
        ("--seed", a.seed),
    ):
        if value is not None:
            cmd += [flag, str(value)]
    if a.enforce_eager:
        cmd.append("--enforce-eager")
    return cmd + list(a.extra_args)


def check_speculative_config(spec: Mapping) -> None:
    """Refuse a speculative config vLLM would misread: no `model` (vLLM would use the target
    checkpoint as the draft), another method, or an implicit `num_speculative_tokens`."""
    if spec.get("method") != "dspark":
        raise LaunchRefused(f'speculative config method={spec.get("method")!r}: must be "dspark".')
    if not spec.get("model"):
        raise LaunchRefused(
            'speculative config has no "model": vLLM would then load the target checkpoint as '
            "the draft (DSparkSpeculatorConfig.default_model). Pass checkpoint=DIR."
        )
    n = spec.get("num_speculative_tokens")
    if not isinstance(n, int) or n < 1:
        raise LaunchRefused(
            f"speculative config num_speculative_tokens={n!r}: must be an explicit int >= 1 "
            "(vLLM 0.34 otherwise uses block_size, one too many for a 1+N draft)."
        )


# ---------------------------------------------------------------- decisions


# The first vLLM release with each DSpark serving feature (read from the published wheels).
VLLM_FEATURES_SINCE = {
    "dspark": (0, 25),
    "adaptive_verification": (0, 33),
    "batch_sharded_sampling": (0, 34),
}


def vllm_minor(version: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m[1]), int(m[2])) if m else None


def vllm_version_ok(version: str | None) -> bool:
    """Whether an installed vLLM version satisfies PINNED_VLLM (>=0.34,<0.35)."""
    return vllm_minor(version) == (0, 34)


def vllm_servable(version: str | None) -> bool:
    """Whether an installed vLLM has the dspark speculator and is not newer than the pin."""
    have = vllm_minor(version)
    return have is not None and VLLM_FEATURES_SINCE["dspark"] <= have < (0, 35)


def vllm_missing_features(version: str | None) -> list[str]:
    """The DSpark serving features an installed vLLM (older than the pin) lacks; every feature
    when the version cannot be read, none for the pinned release or a newer one."""
    have = vllm_minor(version)
    return [f for f, since in VLLM_FEATURES_SINCE.items() if have is None or have < since]


def resolve_num_speculative_tokens(
    requested: int | None, cfg: DSparkConfig
) -> tuple[int, list[str]]:
    """Drafts per step: the checkpoint's layout (B anchor-first, B-1 for 1+N) unless lowered."""
    layout = "anchor-first" if cfg.sample_from_anchor else "1+N"
    native = cfg.num_speculative_tokens
    if requested is None:
        return native, [
            f"num_speculative_tokens={native} (block_size={cfg.block_size}, {layout} layout)"
        ]
    if not 1 <= requested <= native:
        raise LaunchRefused(
            f"num_speculative_tokens={requested}: this {layout} draft with block_size="
            f"{cfg.block_size} drafts at most {native} tokens; choose 1..{native} or null."
        )
    notes = [f"num_speculative_tokens={requested} (checkpoint layout: {native}, {layout})"]
    if requested < native:
        notes.append(
            f"warning: drafting {requested} of the {native} tokens the draft was trained for"
        )
    return requested, notes


def check_markov_head(cfg: DSparkConfig) -> None:
    """Stock vLLM builds a vanilla Markov head whatever markov_head_type says (it never reads the
    key), so a gated/rnn draft would load without error and draft garbage."""
    if cfg.markov_head_type != "vanilla":
        raise LaunchRefused(
            f"markov_head_type={cfg.markov_head_type!r}: stock vLLM serves only 'vanilla' Markov "
            "heads (its loader refuses this one at start-up). Serve it with engine=embedded."
        )


def check_draft_tp(tensor_parallel_size: int, draft_tensor_parallel_size: int | None) -> None:
    """The draft's lm_head must be sharded like the target's. vLLM itself rejects any draft TP
    other than 1 or tp; draft TP 1 under tp > 1 it accepts, but the draft then cannot compute
    vocab-sharded logits, so we refuse that too."""
    if draft_tensor_parallel_size is None or draft_tensor_parallel_size == tensor_parallel_size:
        return
    raise LaunchRefused(
        f"draft_tensor_parallel_size={draft_tensor_parallel_size} != tensor_parallel_size="
        f"{tensor_parallel_size}: the DSpark draft must use the target's TP size "
        "(leave draft_tensor_parallel_size=null)."
    )


def _flag_value(extra_args: Sequence[str], *names: str) -> str | None:
    """Value of `--flag V` / `--flag=V` in extra args (the last one wins), or None."""
    value = None
    for i, arg in enumerate(extra_args):
        for name in names:
            if arg == name and i + 1 < len(extra_args):
                value = extra_args[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def _has_flag(extra_args: Sequence[str], *names: str) -> bool:
    return any(a in names or a.split("=", 1)[0] in names for a in extra_args)


def check_extra_args(extra_args: Sequence[str]) -> None:
    """Refuse extra vLLM flags that this launcher owns: one source of truth per setting."""
    for arg in extra_args:
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_FLAGS:
            raise LaunchRefused(
                f"extra_vllm_args contains {flag}: set it with the launcher key "
                f"{MANAGED_FLAGS[flag]} instead."
            )


def decide_adaptive_verification(
    requested: bool,
    cfg: DSparkConfig,
    *,
    enforce_eager: bool = False,
    extra_args: Sequence[str] = (),
) -> tuple[bool, list[str]]:
    """enable_adaptive_verification only with a trained confidence head (without one, vLLM fits an
    online acceptance estimator instead, which also keeps sequential sampling replicated). Refuse
    what vLLM 0.34's `_validate_adaptive_verification` rejects: no full CUDA graphs (eager), LoRA,
    pipeline parallelism."""
    if not requested:
        return False, ["adaptive verification: off"]
    if not cfg.enable_confidence_head:
        return False, [
            "warning: adaptive_verification=true but the checkpoint has no confidence head; "
            "leaving enable_adaptive_verification off (vLLM would fall back to an online "
            "acceptance estimator)"
        ]
    if enforce_eager:
        raise LaunchRefused(
            "adaptive_verification=true with enforce_eager=true: vLLM's adaptive verification "
            "requires full CUDA graphs. Set enforce_eager=false or adaptive_verification=false."
        )
    if _has_flag(extra_args, "--enable-lora"):
        raise LaunchRefused(
            "adaptive_verification=true with --enable-lora: vLLM 0.34 rejects adaptive "
            "verification with LoRA."
        )
    pp = _flag_value(extra_args, "--pipeline-parallel-size", "-pp")
    if pp is not None and pp.isdigit() and int(pp) > 1:
        raise LaunchRefused(
            f"adaptive_verification=true with pipeline parallel size {pp}: vLLM 0.34 rejects "
            "adaptive verification with pipeline parallelism."
        )
    return True, ["adaptive verification: on (confidence head)"]


def batch_sharded_blockers(
    tensor_parallel_size: int,
    max_num_seqs: int | None,
    max_logprobs: int | None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """vLLM 0.34's `VllmConfig._validate_batch_sharded_sampling`, as plain checks."""
    blockers = []
    num_seqs = VLLM_DEFAULT_MAX_NUM_SEQS if max_num_seqs is None else max_num_seqs
    logprobs = VLLM_DEFAULT_MAX_LOGPROBS if max_logprobs is None else max_logprobs
    if tensor_parallel_size <= 1:
        blockers.append("tensor_parallel_size is 1, so there is nothing to shard")
    elif num_seqs < tensor_parallel_size:
        blockers.append(
            f"max_num_seqs ({num_seqs}) is below tensor_parallel_size ({tensor_parallel_size})"
        )
    if logprobs < 0:
        blockers.append("max_logprobs is -1, allowing vocab-size logprob requests")
    if _has_flag(extra_args, "--return-sampling-mask"):
        blockers.append("return_sampling_mask is set (the batch-sharded gather drops masks)")
    return blockers


def decide_batch_sharded_sampling(
    requested: bool | str,
    tensor_parallel_size: int,
    max_num_seqs: int | None,
    max_logprobs: int | None,
    extra_args: Sequence[str] = (),
) -> tuple[bool, list[str]]:
    """`auto`: pass --enable-batch-sharded-sampling when every precondition holds. `true`: the
    same, but refuse if one fails (as vLLM would). `false`: never."""
    if requested is False:
        return False, ["batch-sharded sampling: off (batch_sharded_sampling=false)"]
    blockers = batch_sharded_blockers(tensor_parallel_size, max_num_seqs, max_logprobs, extra_args)
    if not blockers:
        flag = "--enable-batch-sharded-sampling"
        return True, [f"batch-sharded sampling: on ({flag}, tp={tensor_parallel_size})"]
    if requested is True:
        raise LaunchRefused(
            "batch_sharded_sampling=true, but vLLM would reject --enable-batch-sharded-sampling: "
            + "; ".join(blockers)
            + ". Fix these or set batch_sharded_sampling=auto."
        )
    return False, ["batch-sharded sampling: off (" + "; ".join(blockers) + ")"]


# ---------------------------------------------------------------- sequential sampling sharding


@dataclass(frozen=True)
class ShardingInputs:
    """What `DSparkSpeculator._try_enable_sharded_sequential_sampling` looks at. Defaults describe
    stock vLLM 0.34 (`Qwen3DSparkForCausalLM`: `compute_draft_logits_local`, no fused
    `sample_sequential`) with what this launcher never sets (PCP, watermarking)."""

    tensor_parallel_size: int
    batch_sharded_sampling: bool
    draft_sample_method: str
    enable_adaptive_verification: bool
    has_confidence_head: bool
    dspark_draft_topk: int | None
    target_has_compute_logits_local: bool | None = None  # None: unknown target class
    draft_tensor_parallel_size: int | None = None  # None: the target's
    prefill_context_parallel_size: int = 1
    watermarking: bool = False
    draft_fuses_sample_sequential: bool = False
    draft_has_compute_draft_logits_local: bool = True
    pynccl_disabled: bool = False  # VLLM_DISABLE_PYNCCL


@dataclass(frozen=True)
class ReasonCheck:
    """One of vLLM's six reasons; `log` is the text vLLM logs after "stays replicated ...: "."""

    index: int
    log: str
    applies: bool
    why: str


@dataclass
class SamplingPlan:
    """attempted: whether vLLM evaluates the six reasons at all (tp > 1 and batch-sharded sampling
    active); None when that depends on a target class we cannot see. gate: why (not)."""

    attempted: bool | None
    gate: str
    reasons: list[ReasonCheck] = field(default_factory=list)

    @property
    def first_reason(self) -> ReasonCheck | None:
        return next((r for r in self.reasons if r.applies), None)

    @property
    def sharded(self) -> bool | None:
        if self.attempted is None:
            return None
        return bool(self.attempted) and self.first_reason is None


def sequential_sampling_reasons(s: ShardingInputs) -> SamplingPlan:
    """Which of vLLM's six reasons keep DSpark's sequential (Markov) sampling replicated across TP
    ranks, in vLLM's order (vLLM logs only the first that applies)."""
    tp = s.tensor_parallel_size
    if tp <= 1:
        return SamplingPlan(False, "tp=1: sequential sampling runs on the single rank")
    if not s.batch_sharded_sampling:
        return SamplingPlan(
            False, "batch-sharded sampling is off, so vLLM never tries to shard sequential sampling"
        )
    if s.target_has_compute_logits_local is False:
        return SamplingPlan(
            False,
            "the target class lacks compute_logits_local: vLLM disables batch-sharded sampling",
        )
    gate = f"batch-sharded sampling is on with tp={tp}"
    attempted: bool | None = True
    if s.target_has_compute_logits_local is None:
        attempted = None
        gate += (
            " (if the target class implements compute_logits_local; vLLM 0.34: Qwen3, Llama, "
            "Mistral, GPT-OSS, Qwen3.5)"
        )

    probabilistic = s.draft_sample_method == "probabilistic"
    # The cache gets a row mapping (is sharded) only if batch-sharded sampling is active (it is,
    # here), PCP == 1, no watermarker, and the draft writes the cache itself (no fused
    # sample_sequential: DSparkSpeculator.supports_batch_sharded_draft_logits).
    no_rows = []
    if s.prefill_context_parallel_size != 1:
        no_rows.append(f"prefill context parallel size {s.prefill_context_parallel_size}")
    if s.watermarking:
        no_rows.append("watermarking")
    if s.draft_fuses_sample_sequential:
        no_rows.append("the draft fuses sample_sequential")
    if not probabilistic:
        r1 = ReasonCheck(
            1,
            "the draft logits cache is replicated",
            False,
            "greedy drafting keeps no draft logits cache",
        )
    elif no_rows:
        r1 = ReasonCheck(
            1,
            "the draft logits cache is replicated",
            True,
            "probabilistic drafting without a row mapping: " + ", ".join(no_rows),
        )
    else:
        r1 = ReasonCheck(
            1,
            "the draft logits cache is replicated",
            False,
            "probabilistic, and the cache is row-mapped (sharded)",
        )

    estimator = s.enable_adaptive_verification and not s.has_confidence_head
    r2 = ReasonCheck(
        2,
        "the online acceptance estimator fits on every request's draft logits on every rank",
        estimator,
        "adaptive verification without a confidence head"
        if estimator
        else (
            "adaptive verification uses the confidence head"
            if s.enable_adaptive_verification
            else "adaptive verification is off"
        ),
    )
    topk = s.dspark_draft_topk is not None
    r3 = ReasonCheck(
        3,
        "top-k Markov sampling is not supported",
        topk,
        f"dspark_draft_topk={s.dspark_draft_topk}" if topk else "dspark_draft_topk unset",
    )
    r4 = ReasonCheck(
        4,
        "the draft model fuses its own sequential sampling",
        s.draft_fuses_sample_sequential,
        "the draft model defines sample_sequential"
        if s.draft_fuses_sample_sequential
        else "stock Qwen3DSparkForCausalLM has no sample_sequential",
    )
    draft_tp = tp if s.draft_tensor_parallel_size is None else s.draft_tensor_parallel_size
    why5 = []
    if not s.draft_has_compute_draft_logits_local:
        why5.append("no compute_draft_logits_local")
    if draft_tp != tp:
        why5.append(f"draft lm_head TP {draft_tp} != target TP {tp}")
    r5 = ReasonCheck(
        5,
        "the draft model cannot compute vocab-sharded draft logits",
        bool(why5),
        ", ".join(why5) or f"compute_draft_logits_local with lm_head TP = {tp}",
    )
    r6 = ReasonCheck(
        6,
        "PyNCCL is unavailable",
        s.pynccl_disabled,
        "VLLM_DISABLE_PYNCCL is set"
        if s.pynccl_disabled
        else "VLLM_DISABLE_PYNCCL unset (vLLM also falls back if libnccl fails to load)",
    )
    return SamplingPlan(attempted, gate, [r1, r2, r3, r4, r5, r6])


def format_sampling_plan(plan: SamplingPlan) -> list[str]:
    """Human lines: the gate, each reason with its verdict, and what vLLM will log."""
    if plan.attempted is False:
        return [f"DSpark sequential sampling: replicated ({plan.gate})"]
    lines = [f"DSpark sequential sampling: {plan.gate}; vLLM's six reasons, in its order:"]
    for r in plan.reasons:
        mark = "x" if r.applies else " "
        lines.append(f"  [{mark}] {r.index}. {r.log} -- {r.why}")
    first = plan.first_reason
    if first is not None:
        lines.append(
            "  => stays replicated; vLLM will log: DSpark sequential sampling stays replicated "
            f"across TP ranks: {first.log}."
        )
    else:
        lines.append("  => batch-sharded across TP ranks (no reason applies)")
    return lines


def pynccl_disabled(env: Mapping[str, str]) -> bool:
    """vLLM's reading of VLLM_DISABLE_PYNCCL."""
    return env.get("VLLM_DISABLE_PYNCCL", "False").lower() in ("true", "1")


def target_has_compute_logits_local(architectures: Sequence[str] | None) -> bool | None:
    """True for a known vLLM 0.34 target class with `compute_logits_local`; None if unknown
    (a subclass elsewhere may still inherit it)."""
    if architectures and any(a in TARGETS_WITH_LOCAL_LOGITS for a in architectures):
        return True
    return None
