"""Tiny targets and DSpark drafts written with OUR code (common/), for vLLM to read.

No downloads: the target is a random Qwen3 with a word-level tokenizer built here; drafts are
`DSparkDraftModel`s sized from it, every parameter randomised by `tests.tiny.randomise_` (the
helpers the CPU suite's tiny drafts use), written by `common.checkpoint.save_checkpoint`.
Sizes respect vLLM's CPU attention (head_dim 32 is in CPU_ATTN's supported head sizes).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from common.checkpoint import WEIGHTS_NAME, save_checkpoint
from common.config import DSparkConfig
from common.model import DSparkDraftModel
from tests.tiny import random_vocab_map, randomise_

VOCAB = 320
MASK_ID = 3  # "<mask>": a reserved id, as the DSpark recipe asks
SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>", "<mask>"]
ROLES = ["system", "user", "assistant"]  # plain words of the chat template
TRAINED_WORDS = 32  # words the trained target sees (a 32-entry map learns in seconds)


TARGET_FAMILIES = ("qwen3", "llama")


def target_hf_config(num_layers: int = 6, family: str = "qwen3"):
    """The tiny target's config: Qwen3 (q/k norms) or Llama (no q/k norms, biasless MLP and
    attention, its own loader in vLLM), same sizes."""
    import transformers

    cls = {"qwen3": "Qwen3Config", "llama": "LlamaConfig"}[family]
    return getattr(transformers, cls)(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=512,
        rope_theta=10000.0,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=0,
    )


def word_tokenizer():
    """A word-level fast tokenizer: specials, role words, then `w7..w319`; ChatML-like template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + ROLES)}
    vocab.update({f"w{i}": i for i in range(len(vocab), VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    template = (
        "{%- for m in messages %}{{- '<|im_start|> ' + m['role'] + ' ' + m['content'] + "
        "' <|im_end|> ' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|> assistant ' }}{%- endif %}"
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<pad>",
        mask_token="<mask>",
        chat_template=template,
    )


def write_random_target(
    out: Path, num_layers: int = 6, seed: int = 0, family: str = "qwen3"
) -> Path:
    """Random-weight tiny Qwen3 or Llama + tokenizer (enough for config parsing and weight
    layout)."""
    from transformers import AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(target_hf_config(num_layers, family))
    model.save_pretrained(out)
    word_tokenizer().save_pretrained(out)
    return out


def make_draft(
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
    """A randomised DSpark draft for `target_dir`, saved by our exporter in `fmt`, with the
    embedding / full-vocab lm_head written (a self-contained file: every vLLM parameter comes from
    it) unless `include_embed` / `include_lm_head` say otherwise (the lean export of
    `train.export`: both False).
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
    return load_file(str(ckpt / WEIGHTS_NAME))


def checkpoint_json(ckpt: Path) -> dict:
    return json.loads((ckpt / "config.json").read_text())


# ----------------------------------------------------------------------------- trained target
def chat_rows(n: int, seed: int = 0) -> list[dict]:
    """Prompts of the word-level tiny target: two words; the answer (learned) walks a fixed
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
    tok = word_tokenizer()
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
