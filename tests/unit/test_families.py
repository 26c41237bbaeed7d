"""Every target family the README promises, end to end on tiny random-weight configs.

For each of Llama, Qwen2 (sliding layers), Qwen3, Gemma 3 (sliding layers, tied and sqrt(H)-scaled
embeddings, attention and final-logit soft-capping), Mistral and Phi-3 (sliding window without
`layer_types`) and a Qwen3-MoE, built here from a transformers config (no downloads):
- layer capture equals HF `output_hidden_states[i+1]`, and the teacher logits (soft cap included)
  equal the target's own logits;
- `python -m train.distill` runs two steps with no family-specific flag, exports both layouts, and
  both pass the vLLM contract check and `serve.check --target` against their target;
- the embedded engine loaded from those folders (serve/engine/loader.py, lean export: the draft's
  embedding and lm_head come from the target) generates exactly the target's own greedy `generate`,
  and its verification logits are the target's logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from common.checkpoint import WEIGHTS_NAME
from common.contract import check_checkpoint
from common.target import TargetCapture, softcap_logits, target_head_weights, target_logit_softcap
from serve import check
from serve.engine import Engine, EngineOptions, SamplingParams
from tests.tiny_assets import WORDS, chat_rows, make_tokenizer
from train.distill import main

pytestmark = pytest.mark.usefixtures("torch_single_thread")

LAYERS, HIDDEN = 6, 32
WINDOW = 8  # shorter than prompt + generation, so sliding layers really slide
COMMON = dict(
    hidden_size=HIDDEN,
    intermediate_size=64,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
# name -> (config class, model class, family-specific config keys)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(head_dim=8)),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2),
    ),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=8)),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            head_dim=8,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
            final_logit_softcapping=0.3,  # tiny: random logits (|z| ~ 0.5) are visibly capped
            attn_logit_softcapping=20.0,
            query_pre_attn_scalar=8,
            tie_word_embeddings=True,
        ),
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(head_dim=8, sliding_window=WINDOW)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=WINDOW)),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(head_dim=8, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2),
    ),
}
MOE = {"qwen3_moe"}


def family_config(name: str, tok, **extra):
    cfg_cls, _, kw = FAMILIES[name]
    return getattr(transformers, cfg_cls)(
        vocab_size=len(tok),
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **COMMON,
        **kw,
        **extra,
    )


def build_target(name: str, tok, dtype=torch.float32):
    torch.manual_seed(0)
    # fp64 tests: torch's grouped_mm (the default MoE experts kernel) has no float64 path.
    extra = {"experts_implementation": "eager"} if name in MOE and dtype == torch.float64 else {}
    model = getattr(transformers, FAMILIES[name][1])(family_config(name, tok, **extra))
    with torch.no_grad():  # random norms: a layer that skips its norm cannot hide behind 1.0
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.normal_(1.0, 0.2) if p.abs().sum() > 0 else p.normal_(0.0, 0.2)
    return model.to(dtype).eval()


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer([" ".join(WORDS)] * 50)


@pytest.mark.parametrize("name", FAMILIES)
def test_capture_and_teacher_logits_equal_hf(name, tok):
    target = build_target(name, tok, torch.float64)
    ids = torch.randint(4, len(tok), (2, 13), generator=torch.Generator().manual_seed(1))
    layer_ids = [0, 2, 4]
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    cap = TargetCapture(target, layer_ids)(ids)
    for k, i in enumerate(layer_ids):
        got = cap.aux[..., k * HIDDEN : (k + 1) * HIDDEN]
        torch.testing.assert_close(got, out.hidden_states[i + 1])
    head = target_head_weights(target)[1].detach()
    cap_value = target_logit_softcap(target)
    teacher = softcap_logits(cap.final @ head.T, cap_value)
    torch.testing.assert_close(teacher, out.logits)
    if name == "gemma3":
        assert cap_value == 0.3
        # Negative control: without the soft cap the teacher would not be the target.
        assert float((cap.final @ head.T - out.logits).abs().max()) > 0.05
        # The draft reads the stored embedding table; Gemma's forward scales it by sqrt(H).
        scaled = target.get_input_embeddings()(ids)
        torch.testing.assert_close(scaled, target_head_weights(target)[0][ids] * HIDDEN**0.5)
    else:
        assert cap_value is None


def write_target(name: str, tok, out: Path) -> Path:
    build_target(name, tok).save_pretrained(out)
    tok.save_pretrained(out)
    rows = chat_rows(24, seed=0)
    (out / "data").mkdir(parents=True, exist_ok=True)
    for split, part in (("train", rows[:20]), ("heldout", rows[20:])):
        (out / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return out


# A distill run small enough for a unit test (add trainer.max_steps): one-layer drafts on 64-token
# rows.
TINY_RUN = [
    "data.seq_len=64",
    "trainer.micro_batch_size=2",
    "trainer.num_anchors=8",
    "trainer.eval_batches=1",
    "trainer.progress=false",
    "trainer.threads=1",
    "draft.num_hidden_layers=1",
    "draft.markov_rank=8",
    "draft.block_size=4",
]


@pytest.mark.parametrize("name", FAMILIES)
def test_train_export_check_and_serve(name, tok, tmp_path):
    target_dir = write_target(name, tok, tmp_path / "target")
    out = tmp_path / "run"
    argv = [
        "+experiment=tiny",
        f"target.path={target_dir}",
        "target.build_tiny=false",
        f"output_dir={out}",
        "trainer.max_steps=2",
        *TINY_RUN,
    ]
    assert main(argv) == 0
    for layout in ("final", "final-speculators"):
        assert check_checkpoint(out / layout) == [], layout
        # the default draft.mask_token=auto: the target-fit check reads the token actually chosen
        assert check.main([str(out / layout), "--target", str(target_dir)]) == 0, layout
        modes = {f.name: f.stat().st_mode & 0o777 for f in (out / layout).iterdir()}
        assert set(modes.values()) == {0o644} and "README.md" in modes, modes
    written = json.loads((out / "final" / "config.json").read_text())
    assert written.get("target_logit_softcap") == FAMILIES[name][2].get("final_logit_softcapping")
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 2]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records if "loss" in r)

    opts = EngineOptions(
        target=str(target_dir),
        checkpoint=str(out / "final"),
        dtype="float32",
        draft_sampling="greedy",
        max_model_len=96,
        max_num_seqs=2,
    )
    engine = Engine.from_options(opts)
    target = engine.target_model
    prompts = [tok.encode("the quick brown fox jumps over"), tok.encode("alpha beta gamma")]
    refs = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=20,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=tok.pad_token_id,
        )
        refs.append(gen[0, len(p) :].tolist())
    got = engine.generate(prompts, [SamplingParams(max_tokens=20, ignore_eos=True)] * 2)
    assert got == refs
    assert engine.stats.spec.num_drafts > 0  # the draft really ran

    # Verification reads the target's logits exactly as its forward computes them (soft cap too).
    runner = engine.target
    ids = torch.tensor([prompts[0]])
    runner_logits = runner.forward([0], ids, torch.zeros(1, dtype=torch.long)).logits
    with torch.no_grad():
        torch.testing.assert_close(runner_logits, target(ids).logits.float(), atol=1e-5, rtol=1e-5)


def test_lean_export_holds_only_what_the_draft_owns(tok, tmp_path, capsys):
    """Full vocabulary: no embed_tokens, no lm_head (both are the target's); the engine refills
    them from the target, so the served draft's tables equal the target's."""
    from safetensors import safe_open

    target_dir = write_target("gemma3", tok, tmp_path / "target")
    out = tmp_path / "run"
    argv = [
        "+experiment=tiny",
        f"target.path={target_dir}",
        "target.build_tiny=false",
        f"output_dir={out}",
        "trainer.max_steps=1",
        *TINY_RUN,
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for layout in ("final", "final-speculators"):
        assert f"exported {out / layout}: " in printed
    assert "MiB (shares the target's embed_tokens.weight, lm_head.weight)" in printed
    with safe_open(str(out / "final" / WEIGHTS_NAME), framework="pt") as f:
        keys = set(f.keys())
    assert not {"embed_tokens.weight", "lm_head.weight"} & keys
    engine = Engine.from_options(
        EngineOptions(target=str(target_dir), checkpoint=str(out / "final"), dtype="float32")
    )
    embed, head = target_head_weights(engine.target_model)
    assert torch.equal(engine.draft_model.embed_tokens.weight, embed)
    assert torch.equal(engine.draft_model.lm_head.weight, head)


def test_teacher_applies_the_targets_soft_cap(tok):
    """The loss's teacher is softmax(cap * tanh(z / cap)), the target's own distribution: a draft
    whose logits are exactly the target's soft-capped logits has L1 = 0 (and not without it)."""
    from common.config import DSparkConfig
    from train.loop.vocab_loss import _chunk_terms

    target = build_target("gemma3", tok, torch.float64)
    cfg = DSparkConfig.from_target(target.config, mask_token_id=3)
    assert cfg.target_logit_softcap == 0.3 and cfg.to_hf_dict()["target_logit_softcap"] == 0.3
    ids = torch.randint(4, len(tok), (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = target(ids).logits[0]  # [T, V] HF: soft-capped
        final = TargetCapture(target, [0])(ids).final[0]
    head = target_head_weights(target)[1].detach()
    t = ids.shape[1]
    one_hot = torch.eye(t, dtype=torch.float64)  # draft logits = one_hot @ logits = logits
    labels = ids[0]
    cap = cfg.target_logit_softcap
    _, l1, _ = _chunk_terms(one_hot, final, None, labels, logits.T, head, None, cap)
    assert float(l1.max()) < 1e-9
    _, l1_uncapped, _ = _chunk_terms(one_hot, final, None, labels, logits.T, head, None, None)
    assert float(l1_uncapped.min()) > 1e-3


def test_target_config_hash_catches_another_target_not_another_version(tok):
    """The hash ignores how a transformers version spells the same model (explicit all-full
    layer_types, an unused sliding_window, a defaulted head_dim) and changes with the model; the
    engine's loader refuses a draft trained against another target of equal vocab and widths."""
    from common.config import DSparkConfig, target_config_hash
    from serve.engine.loader import check_pair
    from serve.engine.options import OptionsError

    base = family_config("qwen3", tok).to_dict()
    spelled = dict(base, layer_types=None, sliding_window=None)
    assert target_config_hash(base) == target_config_hash(spelled)
    llama = family_config("llama", tok).to_dict()
    assert target_config_hash(llama) == target_config_hash(dict(llama, head_dim=None))
    other = dict(base, intermediate_size=96)
    assert target_config_hash(other) != target_config_hash(base)

    target = build_target("qwen3", tok)
    cfg = DSparkConfig.from_target(target.config, mask_token_id=3)
    check_pair(target, cfg)  # its own target: fine
    cfg.target_config_hash = target_config_hash(other)
    with pytest.raises(OptionsError, match="config hash"):
        check_pair(target, cfg)
