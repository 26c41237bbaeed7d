"""Generation backends for regenerate.py: `(prompts, row_indices, chunk_index) -> [(text, finish)]`.

`prompts` are token-id lists already rendered with the chat template and a generation prompt. `text`
is the answer up to (excluding) the first eos, decoded by the target tokenizer in both backends so
they store text the same way; `finish` is "stop" (an eos was produced) or "length" (hit
max_new_tokens), as vLLM reports it.
"""

import hashlib
import os

import torch


def derived_seed(*parts) -> int:
    """A 63-bit seed from (seed, chunk or row): distinct per input, stable across runs."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _eos_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError(
            "neither the model's generation_config nor the tokenizer defines an eos token"
        )
    return sorted(set(ids))


def _decode(tokenizer, eos: list[int], new: list[int]) -> tuple[str, str]:
    stop = next((j for j, t in enumerate(new) if t in eos), None)
    answer = new if stop is None else new[:stop]
    return tokenizer.decode(answer, skip_special_tokens=True), "length" if stop is None else "stop"


class HFGenerator:
    """HF `generate` on left-padded batches; RNG seeded per chunk so resumed chunks repeat."""

    def __init__(self, model, tokenizer, sampling: dict):
        from transformers import AutoModelForCausalLM, GenerationConfig

        if isinstance(model, str | os.PathLike):
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model = AutoModelForCausalLM.from_pretrained(os.fspath(model), dtype="auto").to(device)
        self.model = model.eval()
        self.model_name = getattr(model, "name_or_path", "") or type(model).__name__
        self.tokenizer, self.seed = tokenizer, sampling["seed"]
        self.eos = _eos_ids(model, tokenizer)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos[0]
        greedy = sampling["temperature"] == 0
        knobs = (
            {}
            if greedy
            else {
                "temperature": sampling["temperature"],
                "top_p": sampling["top_p"],
                "top_k": sampling["top_k"]
                or 0,  # 0 disables; don't inherit the model's default top_k
            }
        )
        self.config = GenerationConfig(
            max_new_tokens=sampling["max_new_tokens"],
            do_sample=not greedy,
            eos_token_id=self.eos,
            pad_token_id=self.pad,
            **knobs,
        )

    def close(self) -> None:
        pass  # the model belongs to the caller (or is freed with this object)

    def __call__(self, prompts: list[list[int]], row_indices, chunk_index: int):
        if not prompts:
            return []
        width = max(map(len, prompts))
        device = self.model.device
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts], device=device)
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        cuda = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda), torch.no_grad():
            torch.manual_seed(derived_seed(self.seed, chunk_index))
            out = self.model.generate(
                input_ids=ids, attention_mask=attn, generation_config=self.config
            )  # [R, width + new]
        return [_decode(self.tokenizer, self.eos, new) for new in out[:, width:].tolist()]


class VLLMGenerator:
    """vLLM offline `LLM.generate` on token prompts, one SamplingParams (and seed) per row.

    `cuda_graphs=False` (the default) runs vLLM eager: no compile at start-up, but a small target's
    decode is then bound by kernel launches (SmolLM2-135M on the H200: 9.8k tokens/s, 2026-12-03).
    `max_num_seqs`: vLLM's running-request cap (None: vLLM's default). `gpu_memory_utilization`:
    the share of the GPU's memory this engine takes (None: vLLM's default, 0.9); lower it to share
    the GPU with another vLLM engine or a training run. `kv_cache_memory_bytes`: a KV cache of
    that size; vLLM then skips the start-up memory profile, whose check (free memory must not grow
    while it runs) fails when another engine on the GPU frees memory meanwhile, so engines sharing
    a GPU can start at once (vLLM still wants `gpu_memory_utilization` of the GPU free at start)."""

    def __init__(
        self,
        model,
        tokenizer,
        sampling: dict,
        cuda_graphs: bool = False,
        max_num_seqs=None,
        gpu_memory_utilization=None,
        kv_cache_memory_bytes=None,
    ):
        from vllm import LLM

        self.model_name = os.fspath(model)
        self.tokenizer, self.sampling = tokenizer, sampling
        # Run the checkpoint's own dtype, as HFGenerator does (dtype="auto" in HF). vLLM's "auto"
        # would run a float32 checkpoint in bf16 and break greedy ties differently.
        from transformers import AutoConfig

        dtype = AutoConfig.from_pretrained(self.model_name).dtype or "auto"
        extra = {
            k: v
            for k, v in (
                ("max_num_seqs", max_num_seqs),
                ("gpu_memory_utilization", gpu_memory_utilization),
                ("kv_cache_memory_bytes", kv_cache_memory_bytes),
            )
            if v is not None
        }
        self.llm = LLM(
            model=self.model_name,
            enforce_eager=not cuda_graphs,
            seed=sampling["seed"],
            dtype=str(dtype).removeprefix("torch."),
            **extra,
        )
        # vLLM also stops at the model's own eos ids; ours are added in case the tokenizer differs.
        eos = self.llm.get_tokenizer().eos_token_id
        self.eos = sorted({tokenizer.eos_token_id, eos} - {None})

    def close(self) -> None:
        """Stop the engine now, so a second LLM in this process finds its memory free."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None

    def __call__(self, prompts: list[list[int]], row_indices, chunk_index: int):
        from vllm import SamplingParams

        if not prompts:
            return []
        s = self.sampling
        params = [
            SamplingParams(
                temperature=s["temperature"],
                top_p=s["top_p"] if s["temperature"] > 0 else 1.0,
                top_k=s["top_k"] or 0,  # vLLM: 0 disables
                max_tokens=s["max_new_tokens"],
                seed=derived_seed(s["seed"], row),
                stop_token_ids=self.eos,
                detokenize=False,  # decoded below with the target tokenizer, as in HFGenerator
            )
            for row in row_indices
        ]
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        results = []
        for o in outs:
            text, _ = _decode(self.tokenizer, self.eos, list(o.outputs[0].token_ids))
            results.append((text, o.outputs[0].finish_reason))
        return results
