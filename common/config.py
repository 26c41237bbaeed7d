"""`DSparkConfig`: the one schema both training and serving read.

Design choices (see the DSpark paper and docs/vllm-contract.md):
- One flat dataclass whose field names are the keys vLLM reads from the draft's config.json, so
  `to_hf_dict()` is a rename-free dump plus the Qwen3 boilerplate vLLM's config loader expects.
- Every convention that is easy to get silently wrong (layer ids, block layout, draft vocab) is
  derived here and nowhere else: `default_target_layer_ids`, `num_speculative_tokens`,
  `draft_slot_offset`.
- `validate()` runs in `__post_init__`; each error names the field and says what to change.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
# The head types stock vLLM builds (its loader refuses the others at start-up).
VLLM_MARKOV_HEAD_TYPES = ("vanilla",)
DEFAULT_NUM_TARGET_LAYERS = 5


class ConfigError(ValueError):
    """A DSpark config that cannot work; the message names the field and the fix."""


class AssumedConfigKey(UserWarning):
    """A config.json without a key, read with an assumed value (older or foreign exports)."""


def assumed(key: str, value: Any, why: str) -> Any:
    """`value` for a key config.json lacks, said as a warning (never filled silently)."""
    warnings.warn(
        f"config.json has no {key}: assuming {key}={value!r} ({why}); write it into the "
        "checkpoint's config.json to silence this",
        AssumedConfigKey,
        stacklevel=3,
    )
    return value


def default_target_layer_ids(num_target_layers: int, count: int = DEFAULT_NUM_TARGET_LAYERS):
    """`count` layer ids spread evenly over 1..N-3 (0-based), the pinned default.

    Qwen3-8B (N=36) -> [1, 9, 17, 25, 33]. Small targets get fewer, distinct ids.
    """
    lo, hi = 1, num_target_layers - 3
    if hi < lo:
        # Targets of < 4 layers: use every non-final layer.
        return list(range(max(num_target_layers - 1, 1)))
    count = min(count, hi - lo + 1)
    if count == 1:
        return [lo]
    return sorted({lo + round(i * (hi - lo) / (count - 1)) for i in range(count)})


# Top-level keys also written under `dflash_config`: vLLM <= 0.26 sizes `fc` from
# dflash_config.target_layer_ids (else from num_hidden_layers), and 0.26-0.34 read these there
# first, with the same meaning. The top-level keys stay the source; a mismatch is rejected.
DFLASH_MIRROR = ("target_layer_ids", "mask_token_id")


@dataclass
class DSparkConfig:
    """Draft architecture + DSpark choices.

    Sizes: H = hidden_size (draft), T = target_hidden_size, L = len(target_layer_ids),
    V = vocab_size (target vocab), Vd = draft vocab (draft_vocab_size or V), r = markov_rank,
    B = block_size, N = num_speculative_tokens (B with sample_from_anchor, else B-1).
    """

    # Target-derived
    vocab_size: int
    target_hidden_size: int
    target_num_hidden_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    # Draft backbone (Qwen3-style)
    hidden_size: int
    num_hidden_layers: int = 5
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 12288
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    hidden_act: str = "silu"
    # DSpark
    block_size: int = 7
    markov_rank: int = 256
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True
    draft_vocab_size: int | None = None
    sample_from_anchor: bool = True
    dspark_draft_topk: int | None = None
    # Free-form provenance of the target (name or path); not read by vLLM.
    target_name_or_path: str | None = None
    # The target's final-logit soft cap (Gemma's `final_logit_softcapping`): the training teacher
    # applies it as the target's forward does. Not read by vLLM (its target applies it itself).
    target_logit_softcap: float | None = None
    # `target_config_hash` of the target trained against: a loader with the target in hand
    # refuses a different one (same vocab and widths can still be another model).
    target_config_hash: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        if self.draft_vocab_size is not None and self.draft_vocab_size >= self.vocab_size:
            self.draft_vocab_size = None  # a draft vocab as large as the target's is the full one
        self.validate()

    # ---- derived conventions (single source of truth) ----
    @property
    def draft_vocab(self) -> int:
        """Vd: rows of the draft lm_head and of markov_w2."""
        return self.draft_vocab_size or self.vocab_size

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size is not None

    @property
    def num_speculative_tokens(self) -> int:
        """Drafts per block: B for anchor-first (DSpark), B-1 for 1+N (DFlash bonus anchor)."""
        return self.block_size if self.sample_from_anchor else self.block_size - 1

    @property
    def layout_name(self) -> str:
        """The block layout in words: "anchor-first" (DSpark) or "1+N" (DFlash bonus anchor)."""
        return "anchor-first" if self.sample_from_anchor else "1+N"

    def drafts_per_step(self, requested: int | None = None) -> int:
        """Drafts per speculative step: `requested` if given (1..num_speculative_tokens, the most
        this layout drafts), else num_speculative_tokens. Both engines' launchers and loaders
        resolve the count here."""
        native = self.num_speculative_tokens
        if requested is None:
            return native
        if not 1 <= requested <= native:
            raise ConfigError(
                f"num_speculative_tokens={requested} exceeds the checkpoint's {self.layout_name} "
                f"layout (block_size={self.block_size} drafts at most {native} tokens): choose "
                f"1..{native} or null."
            )
        return requested

    @property
    def draft_slot_offset(self) -> int:
        """Block slot that predicts draft j is `j + draft_slot_offset`.

        Draft j always predicts x_{p+1+j} (p = anchor position). Anchor-first: slot j (the anchor
        slot itself predicts the next token). 1+N: slot j+1 (a mask slot predicts its own position).
        """
        return 0 if self.sample_from_anchor else 1

    @property
    def fc_input_size(self) -> int:
        return self.target_hidden_size * len(self.target_layer_ids)

    @property
    def has_markov(self) -> bool:
        return self.markov_rank > 0

    @property
    def confidence_input_size(self) -> int:
        return self.hidden_size + (self.markov_rank if self.confidence_head_with_markov else 0)

    # ---- validation ----
    def validate(self) -> None:
        def need(cond: bool, msg: str):
            if not cond:
                raise ConfigError(msg)

        need(self.block_size >= 2, f"block_size={self.block_size}: must be >= 2.")
        need(
            0 <= self.mask_token_id < self.vocab_size,
            f"mask_token_id={self.mask_token_id} is outside the target vocab [0, {self.vocab_size})"
            ": pick a reserved/special token id of the target tokenizer.",
        )
        need(len(self.target_layer_ids) >= 1, "target_layer_ids is empty: give at least one id.")
        need(
            self.target_layer_ids == sorted(set(self.target_layer_ids)),
            f"target_layer_ids={self.target_layer_ids}: must be strictly ascending, no repeats "
            "(vLLM concatenates captured layers in ascending order).",
        )
        n = self.target_num_hidden_layers
        for i in self.target_layer_ids:
            need(
                0 <= i < n,
                f"target_layer_ids contains {i}, out of range for a target of {n} layers "
                f"(valid: 0..{n - 2}).",
            )
        need(
            n - 1 not in self.target_layer_ids,
            f"target_layer_ids contains the final layer {n - 1}: its HF hidden state is post-norm, "
            "which vLLM never captures. Drop it (default ids spread over 1..N-3).",
        )
        need(
            self.markov_head_type in MARKOV_HEAD_TYPES,
            f"markov_head_type={self.markov_head_type!r}: choose one of {MARKOV_HEAD_TYPES}.",
        )
        need(self.markov_rank >= 0, f"markov_rank={self.markov_rank}: must be >= 0 (0 = DFlash).")
        need(
            not (self.enable_confidence_head and self.confidence_head_with_markov)
            or self.markov_rank > 0,
            "confidence_head_with_markov=true needs markov_rank > 0: set "
            "confidence_head_with_markov=false or give the Markov head a rank.",
        )
        need(
            self.markov_rank > 0 or self.markov_head_type == "vanilla",
            f"markov_head_type={self.markov_head_type!r} with markov_rank=0: a gated/rnn head "
            "needs a rank; use markov_head_type=vanilla for DFlash.",
        )
        if self.draft_vocab_size is not None:
            need(
                self.draft_vocab_size >= 1,
                f"draft_vocab_size={self.draft_vocab_size}: must be >= 1 or null (full vocab).",
            )
        if self.dspark_draft_topk is not None:
            need(
                1 <= self.dspark_draft_topk <= self.draft_vocab,
                f"dspark_draft_topk={self.dspark_draft_topk}: must be in [1, {self.draft_vocab}] "
                "or null.",
            )
            need(self.markov_rank > 0, "dspark_draft_topk needs markov_rank > 0.")
        need(
            self.num_attention_heads % self.num_key_value_heads == 0,
            f"num_attention_heads={self.num_attention_heads} must be a multiple of "
            f"num_key_value_heads={self.num_key_value_heads}.",
        )
        need(self.head_dim % 2 == 0, f"head_dim={self.head_dim}: RoPE needs an even head_dim.")
        need(self.num_hidden_layers >= 1, "num_hidden_layers must be >= 1.")

    # ---- construction ----
    @classmethod
    def from_target(cls, target_config: Any, **choices: Any) -> DSparkConfig:
        """Build from a target's HF config (PretrainedConfig or dict) plus DSpark choices.

        Defaults taken from the target: vocab, widths, head sizes, rope, eps; the draft hidden size
        equals the target's (the draft shares the target's embedding and lm_head).
        `mask_token_id` has no safe default and must be given (or found by the caller).
        """
        tc = target_config if isinstance(target_config, dict) else target_config.to_dict()
        text = tc.get("text_config") or tc
        n_layers = int(text["num_hidden_layers"])
        hidden = int(text["hidden_size"])
        heads = int(text["num_attention_heads"])
        rope_theta = text.get("rope_theta") or (text.get("rope_parameters") or {}).get(
            "rope_theta", 1_000_000.0
        )
        base = dict(
            vocab_size=int(text["vocab_size"]),
            target_hidden_size=hidden,
            target_num_hidden_layers=n_layers,
            target_layer_ids=default_target_layer_ids(n_layers),
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or hidden // heads),
            intermediate_size=int(text.get("intermediate_size") or 4 * hidden),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            max_position_embeddings=int(text.get("max_position_embeddings", 40960)),
            target_name_or_path=tc.get("_name_or_path") or None,
            target_logit_softcap=float(text["final_logit_softcapping"])
            if text.get("final_logit_softcapping")
            else None,
            target_config_hash=target_config_hash(tc),
        )
        unknown = set(choices) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown DSpark config fields {sorted(unknown)}")
        base.update({k: v for k, v in choices.items() if v is not None or k in _NULLABLE})
        if base.get("target_layer_ids") is None:
            base["target_layer_ids"] = default_target_layer_ids(n_layers)
        if "mask_token_id" not in base:
            raise ConfigError("mask_token_id is required: pass the id of a reserved target token.")
        return cls(**base)

    # ---- (de)serialisation: vLLM's config.json ----
    def to_hf_dict(self) -> dict[str, Any]:
        """The canonical dense config.json (docs/vllm-contract.md): a plain Qwen3 config for the
        draft backbone plus the DSpark keys, with both layout keys written consistently."""
        d = {
            "architectures": ["Qwen3DSparkModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": self.hidden_act,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "layer_types": ["full_attention"] * self.num_hidden_layers,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "torch_dtype": "bfloat16",
            "target_layer_ids": list(self.target_layer_ids),
            "target_hidden_size": self.target_hidden_size,
            "target_num_hidden_layers": self.target_num_hidden_layers,
            "block_size": self.block_size,
            "mask_token_id": self.mask_token_id,
            "markov_rank": self.markov_rank,
            "markov_head_type": self.markov_head_type,
            "enable_confidence_head": self.enable_confidence_head,
            "confidence_head_with_markov": self.confidence_head_with_markov,
            "draft_vocab_size": self.draft_vocab,
            "sample_from_anchor": self.sample_from_anchor,
            "dspark_bonus_anchor": not self.sample_from_anchor,
            "num_speculative_tokens": self.num_speculative_tokens,
        }
        d["dflash_config"] = {k: d[k] for k in DFLASH_MIRROR}
        if self.dspark_draft_topk is not None:
            d["dspark_draft_topk"] = self.dspark_draft_topk
        if self.target_name_or_path:
            d["target_name_or_path"] = self.target_name_or_path
        if self.target_logit_softcap is not None:
            d["target_logit_softcap"] = self.target_logit_softcap
        if self.target_config_hash:
            d["target_config_hash"] = self.target_config_hash
        if self.extra:
            d["dspark_extra"] = dict(self.extra)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> DSparkConfig:
        """Inverse of `to_hf_dict`; rejects inconsistent layout keys instead of guessing."""
        both = "sample_from_anchor" in d and "dspark_bonus_anchor" in d
        if both and bool(d["sample_from_anchor"]) == bool(d["dspark_bonus_anchor"]):
            raise ConfigError(
                "config.json has sample_from_anchor == dspark_bonus_anchor: the layout keys "
                "must be opposite (dspark_bonus_anchor = not sample_from_anchor)."
            )
        mirror = d.get("dflash_config") or {}
        for key in DFLASH_MIRROR:
            if key in mirror and key in d and mirror[key] != d[key]:
                raise ConfigError(
                    f"config.json has dflash_config.{key}={mirror[key]} but {key}={d[key]}: "
                    "vLLM reads dflash_config first, so both must be equal."
                )
        sfa = d.get("sample_from_anchor")
        if sfa is None and "dspark_bonus_anchor" in d:  # vLLM 0.25's key: the opposite
            sfa = not d["dspark_bonus_anchor"]
        if sfa is None:
            sfa = assumed("sample_from_anchor", True, "no layout key is set; vLLM 0.34's default")
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names and k not in ("extra",)}
        kw["sample_from_anchor"] = bool(sfa)
        kw["extra"] = dict(d.get("dspark_extra") or {})
        if "target_num_hidden_layers" not in kw:  # older exports
            kw["target_num_hidden_layers"] = assumed(
                "target_num_hidden_layers",
                max(kw["target_layer_ids"]) + 2,
                "the largest target layer id + 2, so that it is not the final layer",
            )
        return cls(**kw)


_NULLABLE = {
    "draft_vocab_size",
    "dspark_draft_topk",
    "target_name_or_path",
    "target_logit_softcap",
    "target_config_hash",
}

# The target-config keys that decide whether a draft fits: its vocabulary, widths, depth,
# attention layout and logit transform. Names and versions are left out on purpose.
TARGET_HASH_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "tie_word_embeddings",
    "layer_types",
    "sliding_window",
    "final_logit_softcapping",
    "rms_norm_eps",
)


def target_config_hash(target_config: Any) -> str:
    """16 hex digits of sha256 over `TARGET_HASH_KEYS` of the target's (text) config, normalised
    so that transformers versions writing the same model differently agree: all-full
    `layer_types` = absent, `sliding_window` only where some layer slides, `head_dim` and
    `num_key_value_heads` defaulted as the models default them."""
    import hashlib
    import json

    tc = target_config if isinstance(target_config, dict) else target_config.to_dict()
    text = tc.get("text_config") or tc
    picked = {k: text.get(k) for k in TARGET_HASH_KEYS}
    kinds = picked["layer_types"]
    if kinds is not None and "sliding_attention" not in kinds:
        picked["layer_types"] = picked["sliding_window"] = None
    if text.get("use_sliding_window") is False:
        picked["sliding_window"] = None
    heads = picked["num_attention_heads"]
    picked["num_key_value_heads"] = picked["num_key_value_heads"] or heads
    if not picked["head_dim"] and heads:
        picked["head_dim"] = picked["hidden_size"] // heads
    return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:16]
