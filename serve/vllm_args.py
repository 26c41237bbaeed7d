"""Our side of `vllm serve` for a DSpark draft: the argv we build and the launches we refuse.

Design choices (docs/vllm-contract.md):
- Pure functions of plain values (the checkpoint's `DSparkConfig`, the `ServeCfg`, the installed
  vLLM's version): tests cover each decision without vLLM or a GPU. `serve.launch_vllm` gathers
  the decisions, `serve.launch` prints them and execs.
- Only what we own: which of our keys becomes which vLLM flag, the speculative config (built by
  `common.spec_config`, the one builder), and refusals of launches that vLLM would reject at
  start-up or serve silently wrong (a gated/rnn Markov head). What vLLM decides at run time, such
  as whether DSpark's sequential sampling is batch-sharded under TP, vLLM logs itself; the vLLM
  suite (tests/vllm) checks the assumptions left here against vLLM's own code.
- `--enable-batch-sharded-sampling` is passed only when its preconditions on our own keys hold:
  vLLM raises, rather than falls back, when the flag is set and one fails.
- CUDA graphs cover the widest verify batch: one verify holds max_num_seqs x (N + 1) tokens
  (1,024 at batch 128 with 7 drafts), above vLLM's default capture ceiling of 512 tokens, and a
  batch wider than the widest graph runs eagerly (vLLM 0.34, batch 128: 35 ms a round eager,
  11.9 ms with graphs to 1,024). So `compilation_config.max_cudagraph_capture_size` is raised to
  that width (rounded up to vLLM's 16-token stride above 256) unless the user set a capture size
  in extra_vllm_args. The key is in every pinned vLLM (0.26 to 0.34 read; 0.34 calls it
  deprecated in favour of split prefill/decode keys, and still honours it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from common.config import VLLM_MARKOV_HEAD_TYPES, DSparkConfig
from common.spec_config import has_feature
from serve.launch_config import LaunchRefused, ServeCfg

# vLLM defaults the batch-sharded decision depends on when our key is null (checked against
# vLLM's own defaults in tests/vllm/test_config.py). max_num_seqs is 256 on CUDA (1024 on >= 70 GB
# GPUs): either is above any sane TP size.
VLLM_DEFAULT_MAX_NUM_SEQS = 256
VLLM_DEFAULT_MAX_LOGPROBS = 20
# vLLM's default ceiling of CUDA-graph capture sizes, in tokens (0.26 to 0.34; 1024 on
# data-centre Blackwell from 0.34), and the stride of its capture grid above 256 tokens.
VLLM_DEFAULT_MAX_CUDAGRAPH_CAPTURE = 512
VLLM_CUDAGRAPH_STRIDE = 16
COMPILATION_FLAGS = ("--compilation-config", "-cc")
CAPTURE_KEYS = ("max_cudagraph_capture_size", "cudagraph_capture_sizes")
CAPTURE_FLAGS = ("--max-cudagraph-capture-size", "--cudagraph-capture-sizes")
PER_REQUEST_FLAG = "--per-request-spec-decode-metrics"
# ServeCfg key -> the `vllm serve` flag that takes its value (null keys are not passed).
VALUE_FLAGS = {
    "tensor_parallel_size": "-tp",
    "host": "--host",
    "port": "--port",
    "served_model_name": "--served-model-name",
    "max_num_seqs": "--max-num-seqs",
    "max_model_len": "--max-model-len",
    "max_logprobs": "--max-logprobs",
    "dtype": "--dtype",
    "seed": "--seed",
}
# ServeCfg keys that end up in --speculative-config.
SPEC_KEYS = (
    "num_speculative_tokens",
    "draft_sampling",
    "adaptive_verification",
    "attention_backend",
    "draft_tensor_parallel_size",
)
# Flags this launcher sets from its own keys; passing them in extra_vllm_args is refused.
MANAGED_FLAGS = {
    **{flag: key for key, flag in VALUE_FLAGS.items()},
    "--tensor-parallel-size": "tensor_parallel_size",
    "--speculative-config": " / ".join(SPEC_KEYS),
    "-sc": " / ".join(SPEC_KEYS),
    "--enable-batch-sharded-sampling": "batch_sharded_sampling",
    "--no-enable-batch-sharded-sampling": "batch_sharded_sampling",
    "--enforce-eager": "enforce_eager",
}


def build_vllm_command(
    cfg: ServeCfg,
    spec: Mapping | None,
    *,
    batch_sharded: bool = False,
    cudagraph_capture_size: int | None = None,
    per_request_metrics: bool = False,
    executable: Sequence[str] = ("vllm",),
) -> list[str]:
    """argv of `vllm serve TARGET ...`; `spec=None` serves the target without drafting.
    `cudagraph_capture_size` (`decide_cudagraph_capture_size`) goes into the compilation config:
    the user's own `--compilation-config JSON` in extra_vllm_args gains the key, else one is
    added. `per_request_metrics`: with a draft, each response carries its own acceptance
    (`--per-request-spec-decode-metrics summary`, unless extra_vllm_args set that flag), which
    `serve.bench` turns into an interval over requests."""
    extra = list(cfg.extra_vllm_args)
    if cudagraph_capture_size is not None:
        extra = with_compilation_key(extra, "max_cudagraph_capture_size", cudagraph_capture_size)
    cmd = [*executable, "serve", cfg.target]
    if spec is not None:
        check_speculative_config(spec)
        cmd += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    for key, flag in VALUE_FLAGS.items():
        value = getattr(cfg, key)
        if value is not None:
            cmd += [flag, str(value)]
    if batch_sharded:
        cmd.append("--enable-batch-sharded-sampling")
    user_flags = {arg.split("=", 1)[0] for arg in extra}
    if per_request_metrics and spec is not None and PER_REQUEST_FLAG not in user_flags:
        cmd += [PER_REQUEST_FLAG, "summary"]
    if cfg.enforce_eager:
        cmd.append("--enforce-eager")
    return cmd + extra


def _compilation_arg(args: Sequence[str]) -> tuple[int, str | None] | None:
    """(index of the arg holding it, its JSON) of a `--compilation-config`/`-cc` in args;
    JSON None when given in a form we do not rewrite (dotted keys, `-O...`); None if absent."""
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in COMPILATION_FLAGS:
            if eq:
                return i, value
            return (i + 1, args[i + 1]) if i + 1 < len(args) else (i, None)
        if flag.startswith(tuple(f + "." for f in COMPILATION_FLAGS)) or flag.startswith("-O"):
            return i, None
    return None


def user_capture_setting(extra_args: Sequence[str]) -> str | None:
    """How extra_vllm_args already set (or may set) the CUDA-graph capture sizes; None if not."""
    for arg in extra_args:
        flag = arg.split("=", 1)[0]
        if flag in CAPTURE_FLAGS or flag.split(".")[-1] in CAPTURE_KEYS:
            return flag
    found = _compilation_arg(extra_args)
    if found is None:
        return None
    i, text = found
    if text is None:
        return f"{extra_args[i]} (a compilation config form this launcher does not rewrite)"
    try:
        given = json.loads(text)
    except json.JSONDecodeError:
        return f"{text} (a compilation config that is not JSON)"
    if not isinstance(given, dict):
        return f"{text} (a compilation config that is not a JSON object)"
    keys = [k for k in CAPTURE_KEYS if k in given]
    return f"--compilation-config {keys[0]}" if keys else None


def with_compilation_key(extra_args: Sequence[str], key: str, value) -> list[str]:
    """extra_args with `key: value` in their `--compilation-config` JSON (added if there is
    none). Call only when `user_capture_setting` is None."""
    args = list(extra_args)
    found = _compilation_arg(args)
    if found is None:
        return [*args, "--compilation-config", json.dumps({key: value}, separators=(",", ":"))]
    i, text = found
    merged = json.dumps({**json.loads(text), key: value}, separators=(",", ":"))
    flag, eq, _ = args[i].partition("=")
    args[i] = f"{flag}={merged}" if eq and flag in COMPILATION_FLAGS else merged
    return args


def decide_cudagraph_capture_size(
    max_num_seqs: int | None,
    num_speculative_tokens: int | None,
    *,
    enforce_eager: bool = False,
    extra_args: Sequence[str] = (),
) -> tuple[int | None, list[str]]:
    """The `max_cudagraph_capture_size` that covers the widest verify batch, max_num_seqs x (N+1)
    tokens, when vLLM's default (512) would not; None leaves vLLM's. `num_speculative_tokens`
    None: no draft. max_num_seqs None: vLLM's default (VLLM_DEFAULT_MAX_NUM_SEQS)."""
    if num_speculative_tokens is None or enforce_eager:
        return None, []
    seqs = VLLM_DEFAULT_MAX_NUM_SEQS if max_num_seqs is None else max_num_seqs
    widest = seqs * (num_speculative_tokens + 1)
    if widest <= VLLM_DEFAULT_MAX_CUDAGRAPH_CAPTURE:
        return None, []
    user = user_capture_setting(extra_args)
    if user is not None:
        return None, [
            f"CUDA graphs: capture sizes as extra_vllm_args set them ({user}); the widest verify "
            f"batch is {widest} tokens (max_num_seqs {seqs} x {num_speculative_tokens + 1})"
        ]
    size = -(-widest // VLLM_CUDAGRAPH_STRIDE) * VLLM_CUDAGRAPH_STRIDE
    default = " (vLLM's default)" if max_num_seqs is None else ""
    return size, [
        f"CUDA graphs: max_cudagraph_capture_size={size} covers the widest verify batch, "
        f"max_num_seqs {seqs}{default} x {num_speculative_tokens + 1} = {widest} tokens "
        f"(vLLM's default {VLLM_DEFAULT_MAX_CUDAGRAPH_CAPTURE} would run it eagerly)"
    ]


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
            "(vLLM otherwise uses block_size, one too many for a 1+N draft)."
        )


def check_markov_head(cfg: DSparkConfig) -> None:
    """Stock vLLM builds only a vanilla Markov head; its loader refuses a gated/rnn one."""
    if cfg.markov_head_type not in VLLM_MARKOV_HEAD_TYPES:
        raise LaunchRefused(
            f"markov_head_type={cfg.markov_head_type!r}: stock vLLM serves only "
            f"{' / '.join(VLLM_MARKOV_HEAD_TYPES)} Markov heads (its loader refuses this one at "
            "start-up). Serve it with engine=embedded."
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


def check_extra_args(extra_args: Sequence[str]) -> None:
    """Refuse extra vLLM flags that this launcher owns: one source of truth per setting."""
    for arg in extra_args:
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_FLAGS:
            raise LaunchRefused(
                f"extra_vllm_args contains {flag}: set it with the launcher key "
                f"{MANAGED_FLAGS[flag]} instead."
            )


def decide_batch_sharded_sampling(
    requested: bool | str,
    tensor_parallel_size: int,
    max_num_seqs: int | None,
    max_logprobs: int | None,
    vllm_version: str | None = None,
    adaptive_verification: bool = False,
) -> tuple[bool, list[str]]:
    """`auto`: pass --enable-batch-sharded-sampling when every precondition holds. `true`: the
    same, but refuse if one fails (as vLLM would). `false`: never. A vLLM without the flag runs
    without it, whatever was asked. `adaptive_verification`: whether the speculative config
    enables it (vLLM before 0.34 refuses the two together)."""
    if requested is False:
        return False, ["batch-sharded sampling: off (batch_sharded_sampling=false)"]
    if not has_feature(vllm_version, "batch_sharded_sampling"):
        return False, [f"batch-sharded sampling: off (vLLM {vllm_version} has no such flag)"]
    num_seqs = VLLM_DEFAULT_MAX_NUM_SEQS if max_num_seqs is None else max_num_seqs
    logprobs = VLLM_DEFAULT_MAX_LOGPROBS if max_logprobs is None else max_logprobs
    blockers = []
    if tensor_parallel_size <= 1:
        blockers.append("tensor_parallel_size is 1, so there is nothing to shard")
    elif num_seqs < tensor_parallel_size:
        blockers.append(
            f"max_num_seqs ({num_seqs}) is below tensor_parallel_size ({tensor_parallel_size})"
        )
    if logprobs < 0:
        blockers.append("max_logprobs is -1, allowing vocab-size logprob requests")
    if adaptive_verification and not has_feature(vllm_version, "batch_sharded_with_adaptive"):
        blockers.append(
            f"adaptive verification is on, which vLLM {vllm_version} does not combine with it"
        )
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
