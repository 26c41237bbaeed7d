"""A tiny random Llama written as a GGUF with the `gguf` package's writer, for the converter tests.

The reference is the HF model it is written from: its weights are rounded to bf16 first, so the
float32 GGUF, the GGUF load and the bf16 folder all hold the same numbers and their logits must
agree to float32 rounding. Q/K are permuted the way llama.cpp's converter does (rows of each head
regrouped from halves to interleaved pairs); transformers' GGUF loader undoes it, so a mistake on
either side shows up as a logit mismatch.

Tokenizer: byte-level BPE ("gpt2" in GGUF terms): 3 control tokens, the 256 byte symbols, and a
few merges; the chat template is SmolLM2's, so the registry's template marking applies.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("a", "n"), ("Ġ", "a")]
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_tokens() -> list[str]:
    return [*SPECIALS, *bytes_to_unicode().values(), *("".join(m) for m in MERGES)]


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    """2 layers, hidden 64, 4 query / 2 KV heads, tied embeddings; weights bf16-representable."""
    cfg = LlamaConfig(
        vocab_size=len(tiny_tokens()),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.2 if p.ndim > 1 else 0.3) + (p.ndim == 1))
            p.copy_(p.to(torch.bfloat16).float())
    return model


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """[n_head * head_dim, in] with each head's rows as (half, pair) -> (pair, half)."""
    out_dim = w.shape[0]
    return (
        w.reshape(n_head, 2, out_dim // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def write_tiny_gguf(path: Path, model: LlamaForCausalLM) -> Path:
    import gguf

    cfg = model.config
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    tokens = tiny_tokens()
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])  # 3 = control
    w.add_token_merges([" ".join(m) for m in MERGES])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(SMOLLM2_TEMPLATE)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                t = _llama_cpp_permute(t, cfg.num_attention_heads)
            elif gg == "attn_k":
                t = _llama_cpp_permute(t, cfg.num_key_value_heads)
            w.add_tensor(f"blk.{i}.{gg}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
