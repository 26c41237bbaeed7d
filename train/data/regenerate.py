"""Replace each conversation's final assistant turn with the target's own answer (optional step).

Training on the target's own outputs matches what the draft must predict at serving time (the paper
regenerates with T=0.7, top-p 0.8). Contracts:
- input rows: chat rows (`messages` or ShareGPT `conversations`); a trailing assistant turn is
  dropped and regenerated, a conversation ending with a user turn gets a new assistant turn.
- output: one JSON line per row, `{...original fields, "messages": [...], "row_index": i,
  "regen": {sampling..., "backend", "model", "finish_reason"}}` (`conversations` is replaced by
  `messages`). File order may differ from row order after a resume; key on `row_index`.
- resumable: rows already in `out_path` are skipped. Rows are processed in fixed chunks
  `[c*batch_size, (c+1)*batch_size)` and a partly written chunk is regenerated whole, with the RNG
  seeded per chunk (hf) or per row (vllm), so a resumed run writes exactly what an uninterrupted run
  with the same batch_size would.
- `sampling`: temperature (0 = greedy), top_p, top_k (None/0 = off), max_new_tokens, seed.
"""

import importlib.util
import json
import logging
import os
import time
from collections.abc import Sequence

from tqdm.auto import tqdm

from common.atomic_file import replaced_whole
from train.data.regen_backends import HFGenerator, VLLMGenerator
from train.data.rows import BadRowError, normalize_row

log = logging.getLogger(__name__)

SAMPLING_DEFAULTS = {
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": None,
    "max_new_tokens": 512,
    "seed": 0,
}
BACKENDS = ("hf", "vllm", "auto")


def checked_sampling(sampling: dict) -> dict:
    unknown = set(sampling) - set(SAMPLING_DEFAULTS)
    if unknown:
        raise ValueError(
            f"unknown sampling keys {sorted(unknown)}; allowed: {sorted(SAMPLING_DEFAULTS)}"
        )
    out = {**SAMPLING_DEFAULTS, **sampling}
    if out["temperature"] < 0 or not 0 < out["top_p"] <= 1 or out["max_new_tokens"] < 1:
        raise ValueError(
            f"bad sampling parameters {out}: need temperature>=0, 0<top_p<=1, max_new_tokens>=1"
        )
    return out


def _done_rows(out_path: str, sampling: dict) -> set[int]:
    """Row indices already written. Cuts a torn last line (a crash mid-write) off the file."""
    if not os.path.exists(out_path):
        return set()
    with open(out_path, encoding="utf-8", newline="") as f:
        lines = f.readlines()
    done, keep = set(), 0
    for n, line in enumerate(lines):
        try:
            if not line.endswith("\n"):  # only the last line can lack it: a torn write
                break
            rec = json.loads(line)
        except json.JSONDecodeError:
            if n != len(lines) - 1:
                raise ValueError(
                    f"{out_path}:{n + 1} is not valid JSON; fix or delete that line"
                ) from None
            break
        params = {k: rec["regen"].get(k) for k in sampling}
        if params != sampling:
            raise ValueError(
                f"{out_path}:{n + 1} was generated with {params}, this run uses {sampling}; "
                "use a new out_path for new sampling parameters"
            )
        done.add(int(rec["row_index"]))
        keep += len(line.encode("utf-8"))
    if keep != os.path.getsize(out_path):
        with open(out_path, "r+b") as f:
            f.truncate(keep)
    return done


def regeneration_prompt(row, index: int = 0) -> list[dict]:
    """What the target is asked to answer: the row's messages without a final assistant turn
    (all of them when the row has none). `index` names the row in a BadRowError."""
    content = normalize_row(row, index, need_assistant=False)
    if isinstance(content, str):
        raise BadRowError(index, "a plain `text` row has no assistant turn to regenerate")
    if content[-1]["role"] == "assistant":
        content = content[:-1]
    if not content:
        raise BadRowError(index, "the conversation is a lone assistant turn; there is no prompt")
    return content


def _chunks(rows, batch_size, tokenizer, template_kwargs, on_bad_row):
    """Fixed chunks `[c*B, (c+1)*B)` of (row index, prompt messages, prompt token ids). A prompt
    that several rows share (several answers per prompt) is rendered and tokenized once."""
    chunks, skipped, rendered = [], [], {}
    for start in range(0, len(rows), batch_size):
        chunk = []
        for i in range(start, min(start + batch_size, len(rows))):
            try:
                msgs = regeneration_prompt(rows[i], i)
            except BadRowError as e:
                if on_bad_row != "skip":
                    raise
                skipped.append(str(e))
                continue
            key = json.dumps(msgs, sort_keys=True, ensure_ascii=False)
            if key not in rendered:
                rendered[key] = list(
                    tokenizer.apply_chat_template(
                        msgs, add_generation_prompt=True, return_dict=True, **template_kwargs
                    )["input_ids"]
                )
            chunk.append((i, msgs, rendered[key]))
        if chunk:
            chunks.append(chunk)
    return chunks, skipped


def pick_backend(backend: str, model) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    has_vllm = importlib.util.find_spec("vllm") is not None
    if backend == "auto":
        return "vllm" if has_vllm and isinstance(model, str | os.PathLike) else "hf"
    if backend == "vllm" and not has_vllm:
        raise ImportError(
            "backend='vllm' but vllm is not importable; use backend='hf' or install vllm"
        )
    if backend == "vllm" and not isinstance(model, str | os.PathLike):
        raise TypeError("backend='vllm' needs `model` as a path or hub id, not a loaded model")
    return backend


def open_generator(backend: str, model, tokenizer, sampling: dict, vllm_options=None):
    """The generator of `backend` ("hf" or "vllm", as `pick_backend` returns it) for `model`;
    `vllm_options`: `VLLMGenerator`'s keyword arguments."""
    if backend == "vllm":
        return VLLMGenerator(model, tokenizer, sampling, **(vllm_options or {}))
    return HFGenerator(model, tokenizer, sampling)


def regenerate_responses(
    rows: Sequence[dict],
    model,
    tokenizer,
    sampling: dict,
    out_path: str | os.PathLike,
    batch_size: int = 8,
    *,
    backend: str = "hf",
    template_kwargs: dict | None = None,
    on_bad_row: str = "error",
    vllm_options: dict | None = None,
    deadline: float | None = None,
    shard: tuple[int, int] = (0, 1),
    on_ready=None,
) -> int:
    """Regenerate rows not yet in `out_path` (see module doc); returns the number of rows written.

    `model`: a loaded HF causal LM or a path (hf loads it; vllm needs a path). `tokenizer`: the
    target tokenizer (instance or path), used for the chat template. `template_kwargs` go to the
    chat template (e.g. {"enable_thinking": False}). `vllm_options`: `VLLMGenerator`'s
    `cuda_graphs` / `max_num_seqs` / `gpu_memory_utilization` (vllm backend only). `deadline`: a
    `time.monotonic()` to be done by: no chunk starts after it, nor one that the previous chunk's
    duration says would end past it (the first always starts); a rerun resumes from there.
    `shard=(k, n)`: only chunks c with c % n == k, for n engines sharing one GPU (each its own
    process and `out_path`; `join_shards` puts them together). `on_ready()`: called once the
    engine is built, before the first chunk (so a caller can start the next engine then).
    """
    k, n = shard
    if not 0 <= k < n:
        raise ValueError(f"shard must be (k, n) with 0 <= k < n, got {shard}")
    sampling = checked_sampling(sampling)
    if on_bad_row not in ("error", "skip"):
        raise ValueError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    out_path = os.fspath(out_path)
    backend = pick_backend(backend, model)
    if isinstance(tokenizer, str | os.PathLike):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    done = _done_rows(out_path, sampling)
    # Prompts are cheap; building them all first lets fully written chunks be skipped before any
    # model is loaded, and reports every bad row up front.
    chunks, skipped = _chunks(rows, batch_size, tokenizer, template_kwargs or {}, on_bad_row)
    if skipped:
        log.warning("skipped %d malformed rows (first: %s)", len(skipped), skipped[0])
    todo = [
        c
        for c in chunks
        if shard_of(c[0][0], batch_size, n) == k and not all(i in done for i, _, _ in c)
    ]
    if not todo:
        if on_ready is not None:
            on_ready()
        return 0
    generate = open_generator(backend, model, tokenizer, sampling, vllm_options)
    if on_ready is not None:
        on_ready()
    written = 0
    bar = tqdm(total=sum(len(c) for c in todo), unit="row", desc="regenerate")
    try:
        with open(out_path, "a", encoding="utf-8") as out:
            last = 0.0  # seconds the previous chunk took
            for chunk in todo:
                start = time.monotonic()
                if deadline is not None and start + last > deadline:
                    log.warning("deadline: %d rows written, the rest left for a rerun", written)
                    break
                prompts, indices = [p for _, _, p in chunk], [i for i, _, _ in chunk]
                results = generate(prompts, indices, chunk_index=indices[0] // batch_size)
                last = time.monotonic() - start
                for (i, msgs, _), (text, finish) in zip(chunk, results):
                    if i in done:  # a partly written chunk is regenerated whole (module doc)
                        continue
                    row = {k: v for k, v in dict(rows[i]).items() if k != "conversations"}
                    row["messages"] = [*msgs, {"role": "assistant", "content": text}]
                    row["row_index"] = i
                    row["regen"] = {
                        **sampling,
                        "backend": backend,
                        "model": generate.model_name,
                        "finish_reason": finish,
                    }
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
                    written += 1
                out.flush()
                bar.update(len(chunk))
    finally:
        bar.close()
        generate.close()
    return written


def shard_of(row_index: int, batch_size: int, n: int) -> int:
    """The shard (of n) whose engine answers this row: its fixed chunk's number mod n, so a run
    cut by a deadline holds the first chunks of every shard (the held-out prompts come first)."""
    return (row_index // batch_size) % n


def shard_path(out_path: str | os.PathLike, k: int, n: int) -> str:
    return f"{os.fspath(out_path)}.shard{k}-of-{n}"


def _row_index(line: str) -> int:
    return int(json.loads(line)["row_index"])


def seed_shard(out_path: str | os.PathLike, k: int, n: int, batch_size: int) -> str:
    """Shard k's own file beside `out_path`; made on first use from the rows `out_path` already
    holds for that shard (answers restored from an earlier session), so the shard resumes after
    them. Returns its path."""
    part = shard_path(out_path, k, n)
    if os.path.exists(part) or not os.path.exists(out_path):
        return part
    with (
        open(out_path, encoding="utf-8") as src,
        replaced_whole(part) as tmp,
        open(tmp, "w", encoding="utf-8") as dst,
    ):
        whole = (ln for ln in src if ln.endswith("\n"))  # a torn last line is redone
        dst.writelines(ln for ln in whole if shard_of(_row_index(ln), batch_size, n) == k)
    return part


def join_shards(out_path: str | os.PathLike, n: int) -> dict:
    """Put the n shard files (and the rows `out_path` already held) together as `out_path`, one
    line per row index (the first seen), written whole then renamed; the shard files go. A shard
    whose engine never started is simply absent. Returns {"rows", "from"}: rows per source."""
    out_path = os.fspath(out_path)
    sources = [out_path] + [shard_path(out_path, k, n) for k in range(n)]
    seen, counts = set(), {}
    with replaced_whole(out_path) as tmp, open(tmp, "w", encoding="utf-8") as dst:
        for src in sources:
            if not os.path.exists(src):
                continue
            added = 0
            with open(src, encoding="utf-8") as f:
                for line in f:
                    if not line.endswith("\n"):
                        continue  # a torn last line: the shard's rerun would redo it
                    i = _row_index(line)
                    if i not in seen:
                        seen.add(i)
                        dst.write(line)
                        added += 1
            counts[src] = added
    for src in sources[1:]:
        if os.path.exists(src):
            os.remove(src)
    return {"rows": len(seen), "from": counts}


def summarize_regenerated(out_path: str | os.PathLike, tokenizer) -> dict:
    """What a regenerated file holds, for provenance: rows, finish reasons, prompt and response
    token counts (re-tokenized with the target tokenizer), and the sampling and backend used."""
    rows, prompt_tokens, response_tokens = 0, 0, 0
    finish, params = {}, set()
    with open(out_path, encoding="utf-8") as f:
        for line in f:
            rows += 1
            rec = json.loads(line)
            regen = rec["regen"]
            finish[regen["finish_reason"]] = finish.get(regen["finish_reason"], 0) + 1
            params.add(json.dumps({k: regen[k] for k in (*SAMPLING_DEFAULTS, "backend", "model")}))
            answer = rec["messages"][-1]["content"]
            response_tokens += len(tokenizer(answer, add_special_tokens=False)["input_ids"])
            prompt_tokens += sum(
                len(tokenizer(m["content"], add_special_tokens=False)["input_ids"])
                for m in rec["messages"][:-1]
            )
    if len(params) > 1:
        raise ValueError(f"{out_path} mixes generation settings: {sorted(params)}")
    return {
        "file": os.fspath(out_path),
        "rows": rows,
        "finish_reasons": finish,
        "prompt_content_tokens": prompt_tokens,
        "response_tokens": response_tokens,
        "mean_response_tokens": response_tokens / rows if rows else 0.0,
        "generation": json.loads(params.pop()) if params else None,
    }
