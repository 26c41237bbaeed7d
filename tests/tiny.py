"""The tiny models every test suite builds from (CPU suite, model card, vLLM and interop suites):
the one source of tiny targets, tokenizers and drafts, in memory and as checkpoints on disk.
Importable with the main package's dependencies alone (no vLLM, no pytest).

Drafts: `tiny_config(**overrides)` is the one tiny `DSparkConfig` (V=96 target vocab, H=32 draft
hidden, 2 target layers of width 16 captured from a 6-layer target, 2 draft layers, B=4, r=8);
`tiny_model(...)` a draft of it with a random "target" embedding / lm_head and vocab map.
`randomise_` gives every parameter distinct random values (the vLLM suite's poison-and-fill tests
need that), and `random_vocab_map` is the reduced-vocab map both draft builders use.

Targets: `tiny_target_config` is the tiny Qwen3 (or Llama) config the suites start from (head_dim
= hidden / heads, MLP 2x hidden, untied embeddings unless asked); `word_tokenizer` the word-level
tokenizer they pair it with; `save_random_target` writes the pair.

Checkpoints (the vLLM and interop suites; `random_target` in tests/conftest.py): a V=320 word-level
target sized for vLLM's CPU attention (head_dim 32 is in CPU_ATTN's supported head sizes,
`write_random_target`, or trained in seconds, `write_trained_target`) and drafts sized from it,
written by our exporter (`write_draft`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from common.checkpoint import WEIGHTS_NAME, save_checkpoint
from common.config import DSparkConfig
from common.model import DSparkDraftModel
from common.vocab import VocabMap, build_vocab_map

TINY = dict(
    vocab_size=96,
    target_hidden_size=16,
    target_num_hidden_layers=6,
    target_layer_ids=[1, 3],
    mask_token_id=95,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    intermediate_size=48,
    max_position_embeddings=256,
    block_size=4,
    markov_rank=8,
)


def tiny_config(**overrides) -> DSparkConfig:
    return DSparkConfig(**{**TINY, **overrides})


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> DSparkDraftModel:
    """A randomly initialised draft in eval mode. The frozen embedding / lm_head come from a random
    "target"; with `draft_vocab_size` set, d2t/t2d come from random counts (`build_vocab_map`).
    RMSNorm weights are randomised too, so a test cannot pass because a norm is the identity."""
    cfg = tiny_config(**overrides)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = DSparkDraftModel(cfg)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
    lm_head = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen) / cfg.hidden_size**0.5
    if cfg.reduced_vocab:
        vm = random_vocab_map(cfg, gen)
        model.init_from_target(embed, lm_head, vm.d2t, vm.t2d)
    else:
        model.init_from_target(embed, lm_head)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
    return model.to(dtype).eval()


def random_vocab_map(cfg: DSparkConfig, gen: torch.Generator, max_count: int = 5) -> VocabMap:
    """The reduced-vocab map of random token counts (`cfg.draft_vocab` ids)."""
    counts = torch.randint(0, max_count, (cfg.vocab_size,), generator=gen)
    return build_vocab_map(counts, cfg.draft_vocab)


@torch.no_grad()
def randomise_(model: DSparkDraftModel, seed: int) -> None:
    """Every parameter random and distinct (norms near 1), so a swapped or dropped tensor cannot
    hide behind an init value."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.2 * noise)  # distinct per norm: a swapped norm changes outputs
        else:
            p.copy_(noise / max(p.shape[-1], 1) ** 0.5)


# ----------------------------------------------------------------------------- targets
TARGET_FAMILIES = ("qwen3", "llama")


def tiny_target_config(
    vocab_size: int,
    hidden_size: int = 32,
    num_hidden_layers: int = 4,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    family: str = "qwen3",
    **overrides,
):
    """A tiny Qwen3 (q/k norms) or Llama (no q/k norms, biasless MLP and attention, its own
    loader in vLLM) target config, same sizes; overrides pass through."""
    import transformers

    cls = {"qwen3": "Qwen3Config", "llama": "LlamaConfig"}[family]
    return getattr(transformers, cls)(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=hidden_size // num_attention_heads,
        **{"tie_word_embeddings": False, **overrides},
    )


def word_tokenizer(words: list[str], chat_template: str, **special_tokens):
    """A word-level fast tokenizer: id i is `words[i]`, whitespace-split; `special_tokens` name
    which words are eos/pad/unk/mask (unk_token is required: it stands for unknown words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(
        models.WordLevel({w: i for i, w in enumerate(words)}, special_tokens["unk_token"])
    )
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, chat_template=chat_template, **special_tokens
    )


def save_random_target(out: Path, config, tokenizer, seed: int = 0) -> Path:
    """A randomly initialised target of `config` (seeded) and its tokenizer, written to `out`."""
    from transformers import AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# ----------------------------------------------------------------------------- checkpoints
VOCAB = 320
MASK_ID = 3  # "<mask>": a reserved id, as the DSpark recipe asks
SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>", "<mask>"]
ROLES = ["system", "user", "assistant"]  # plain words of the chat template
TRAINED_WORDS = 32  # words the trained target sees (a 32-entry map learns in seconds)
CHATML_WORDS = (
    "{%- for m in messages %}{{- '<|im_start|> ' + m['role'] + ' ' + m['content'] + "
    "' <|im_end|> ' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|> assistant ' }}{%- endif %}"
)


def target_hf_config(num_layers: int = 6, family: str = "qwen3"):
    """The checkpoint suites' target: V=320, hidden 64, 2 heads of 32 (1 KV head)."""
    return tiny_target_config(
        VOCAB,
        64,
        num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        family=family,
        max_position_embeddings=512,
        rope_theta=10000.0,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=0,
    )


def chatml_word_tokenizer():
    """Specials, role words, then `w7..w319`; a ChatML-like template."""
    words = SPECIALS + ROLES
    words += [f"w{i}" for i in range(len(words), VOCAB)]
    return word_tokenizer(
        words,
        CHATML_WORDS,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<pad>",
        mask_token="<mask>",
    )


def write_random_target(
    out: Path, num_layers: int = 6, seed: int = 0, family: str = "qwen3"
) -> Path:
    """Random-weight tiny Qwen3 or Llama + tokenizer (enough for config parsing and weight
    layout)."""
    return save_random_target(
        out, target_hf_config(num_layers, family), chatml_word_tokenizer(), seed
    )


def write_draft(
    target_dir: Path,
    out_dir: Path,
    *,
    sample_from_anchor: bool = True,
    fmt: str = "canonical",
    draft_vocab_size: int | None = 200,
    dtype: torch.dtype = torch.float32,
    include_embed: bool = True,
    include_lm_head: bool = True,
    embed_from_target: bool = False,
    seed: int = 0,
    **choices,
) -> tuple[Path, DSparkDraftModel]:
    """A randomised DSpark draft for `target_dir` (2 layers, B=4, r=16 unless `choices` say
    otherwise), saved by our exporter in `fmt`, with the embedding / full-vocab lm_head written
    (a self-contained file: every vLLM parameter comes from it) unless `include_embed` /
    `include_lm_head` say otherwise (the lean export of `train.publish.export`: both False).
    `embed_from_target`: embedding and lm_head (rows t2d) copied from the target's weights, as
    the training pipeline does (`init_from_target`), instead of random."""
    from transformers import AutoConfig

    tcfg = AutoConfig.from_pretrained(target_dir)
    cfg = DSparkConfig.from_target(
        tcfg,
        mask_token_id=MASK_ID,
        draft_vocab_size=draft_vocab_size,
        sample_from_anchor=sample_from_anchor,
        target_name_or_path=str(target_dir),
        **{"num_hidden_layers": 2, "block_size": 4, "markov_rank": 16, **choices},
    )
    model = DSparkDraftModel(cfg)
    randomise_(model, seed)
    d2t = t2d = None
    if cfg.reduced_vocab:
        vm = random_vocab_map(cfg, torch.Generator().manual_seed(seed), max_count=1000)
        d2t, t2d = vm.d2t, vm.t2d
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
    if embed_from_target:
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
        model.init_from_target(
            target.get_input_embeddings().weight, target.lm_head.weight, d2t=d2t, t2d=t2d
        )
    path = save_checkpoint(
        model,
        out_dir,
        fmt=fmt,
        dtype=dtype,
        include_embed=include_embed,
        include_lm_head=include_lm_head,
        verifier=str(target_dir),
    )
    return path, model


def checkpoint_tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(ckpt / WEIGHTS_NAME))


def checkpoint_json(ckpt: Path) -> dict:
    return json.loads((ckpt / "config.json").read_text())


def word_chat_rows(n: int, seed: int = 0) -> list[dict]:
    """Prompts of the word-level trained target: two words; the answer (learned) walks a fixed
    permutation from the last word."""
    g = torch.Generator().manual_seed(seed)
    first = len(SPECIALS + ROLES)
    words = torch.randint(first, first + TRAINED_WORDS, (n, 2), generator=g).tolist()
    return [{"messages": [{"role": "user", "content": f"w{a} w{b}"}]} for a, b in words]


def write_trained_target(out: Path, steps: int = 150, answer_len: int = 6, seed: int = 0) -> Path:
    """A tiny Qwen3 trained (seconds on CPU) to answer a prompt `wA wB` (A, B among the first
    `TRAINED_WORDS` words) with the permutation walk `perm[B], perm[perm[B]], ...` of `answer_len`
    words then `<|im_end|>`. Greedy decoding of such a model has wide top-1 margins, so two correct
    implementations cannot tie-break apart."""
    from transformers import Qwen3ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = chatml_word_tokenizer()
    g = torch.Generator().manual_seed(seed)
    first = len(SPECIALS + ROLES)
    perm = first + torch.randperm(TRAINED_WORDS, generator=g)  # word id -> next word id

    def sample(batch: int) -> torch.Tensor:
        rows = []
        for a, b in torch.randint(first, first + TRAINED_WORDS, (batch, 2), generator=g).tolist():
            ans, cur = [], b
            for _ in range(answer_len):
                cur = int(perm[cur - first])
                ans.append(cur)
            text = tok.apply_chat_template(
                [{"role": "user", "content": f"w{a} w{b}"}],
                add_generation_prompt=True,
                tokenize=False,
            )
            prompt = tok(text)["input_ids"]
            rows.append((prompt + ans + [tok.eos_token_id], len(prompt)))
        ids = torch.tensor([r for r, _ in rows])
        labels = ids.clone()
        labels[:, : rows[0][1]] = -100  # loss on the answer only (prompts have equal length)
        return ids, labels

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(target_hf_config(num_layers=4))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        ids, labels = sample(32)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "train_loss.txt").write_text(f"{loss.item():.4f}\n")
    return out
