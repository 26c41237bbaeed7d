"""`python -m train.prepare.regenerate`: the CLI writes what `regenerate_responses` writes,
resumes, and
summarises the file (rows, token counts re-counted naively here, one set of sampling settings)."""

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from tests.integration.test_data import chat, make_tokenizer
from train.data.regenerate import summarize_regenerated
from train.distill import data_provenance
from train.prepare.regenerate import main


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    tok = make_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    d = tmp_path_factory.mktemp("target")
    Qwen3ForCausalLM(cfg).eval().save_pretrained(d)
    tok.save_pretrained(d)
    return d


def hf_args(target_dir, tmp_path, rows: int) -> list[str]:
    """CLI arguments for `rows` chat rows answered by the HF backend, 4 tokens, chunks of 2."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(chat(i)) + "\n" for i in range(rows)))
    args = ["--target", str(target_dir), "--data", str(data), "--backend", "hf"]
    return args + ["--max-new-tokens", "4", "--batch-size", "2"]


def test_cli_regenerates_resumes_and_summarises(target_dir, tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    rows = [chat(i) for i in range(5)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "regen.jsonl"
    args = ["--target", str(target_dir), "--data", str(data), "--out", str(out)]
    args += ["--backend", "hf", "--max-new-tokens", "4", "--batch-size", "2"]
    assert main(args) == 0
    first = out.read_text()
    recs = [json.loads(x) for x in first.splitlines()]
    assert sorted(r["row_index"] for r in recs) == list(range(5))
    # Kill after two rows: the rerun writes the rest, and the file equals the uninterrupted one.
    out.write_text("".join(first.splitlines(keepends=True)[:2]))
    assert main(args) == 0
    assert out.read_text() == first
    summary = json.loads((tmp_path / "regen.jsonl.summary.json").read_text())
    tok = make_tokenizer()
    answers = [r["messages"][-1]["content"] for r in recs]
    naive = sum(len(tok(a, add_special_tokens=False)["input_ids"]) for a in answers)
    assert summary["rows"] == 5 and summary["response_tokens"] == naive
    assert summary["written_this_run"] == 3 and summary["source_rows"] == 5
    assert sum(summary["finish_reasons"].values()) == 5
    assert summary["generation"]["temperature"] == 0.7 and summary["generation"]["backend"] == "hf"
    # distill's provenance picks the summary up from beside the training file.
    assert data_provenance(str(out))["regenerated"]["rows"] == 5
    assert data_provenance(str(data))["regenerated"] is None


def test_summary_refuses_mixed_settings(target_dir, tmp_path):
    out = tmp_path / "mixed.jsonl"
    rec = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    base = {"temperature": 0.0, "top_p": 1.0, "top_k": None, "max_new_tokens": 4, "seed": 0}
    lines = [
        {**rec, "regen": {**base, "backend": "hf", "model": "m", "finish_reason": "stop"}},
        {
            **rec,
            "regen": {**base, "seed": 1, "backend": "hf", "model": "m", "finish_reason": "stop"},
        },
    ]
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(ValueError, match="mixes generation settings"):
        summarize_regenerated(out, make_tokenizer())


def test_vllm_flags_reach_the_engine(target_dir, tmp_path, monkeypatch):
    """--vllm-cuda-graphs / --vllm-max-num-seqs / --vllm-gpu-memory / --vllm-kv-cache-gib become
    vLLM's enforce_eager / max_num_seqs / gpu_memory_utilization / kv_cache_memory_bytes (a
    stand-in `vllm` module records the engine's arguments and echoes eos; the real engine is in
    the vLLM suite); without them the engine stays eager with vLLM's own batch cap, memory share
    and profiled KV cache, and a share outside (0, 1] or a KV cache of 0 GiB is refused."""
    import importlib.machinery
    import sys
    import types

    seen = []

    class LLM:
        def __init__(self, **kwargs):
            seen.append(kwargs)

        def get_tokenizer(self):
            return types.SimpleNamespace(eos_token_id=None)

        def generate(self, inputs, params, use_tqdm=False):
            out = types.SimpleNamespace(token_ids=[params[0].eos], finish_reason="stop")
            return [types.SimpleNamespace(outputs=[out]) for _ in inputs]

    class SamplingParams:
        def __init__(self, stop_token_ids, **kw):
            self.eos = stop_token_ids[0]

    fake = types.ModuleType("vllm")
    fake.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    fake.LLM, fake.SamplingParams = LLM, SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", fake)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(chat(0)) + "\n")
    base = ["--target", str(target_dir), "--data", str(data), "--backend", "vllm"]
    assert main([*base, "--out", str(tmp_path / "a.jsonl")]) == 0
    assert (
        main(
            [
                *base,
                "--out",
                str(tmp_path / "b.jsonl"),
                "--vllm-cuda-graphs",
                "--vllm-max-num-seqs",
                "64",
                "--vllm-gpu-memory",
                "0.5",
                "--vllm-kv-cache-gib",
                "1.5",
            ]
        )
        == 0
    )
    assert seen[0]["enforce_eager"] is True
    assert not {"max_num_seqs", "gpu_memory_utilization", "kv_cache_memory_bytes"} & set(seen[0])
    assert seen[1]["enforce_eager"] is False and seen[1]["max_num_seqs"] == 64
    assert seen[1]["gpu_memory_utilization"] == 0.5
    assert seen[1]["kv_cache_memory_bytes"] == 3 * 2**29
    summary = json.loads((tmp_path / "b.jsonl.summary.json").read_text())
    assert summary["vllm_options_this_run"] == {
        "cuda_graphs": True,
        "max_num_seqs": 64,
        "gpu_memory_utilization": 0.5,
        "kv_cache_memory_bytes": 3 * 2**29,
    }
    with pytest.raises(SystemExit):
        main([*base, "--out", str(tmp_path / "c.jsonl"), "--vllm-gpu-memory", "1.5"])
    with pytest.raises(SystemExit):
        main([*base, "--out", str(tmp_path / "d.jsonl"), "--vllm-kv-cache-gib", "0"])
    assert len(seen) == 2


def test_deadline_stops_between_chunks_and_a_rerun_completes(target_dir, tmp_path, monkeypatch):
    """No chunk starts that the previous one's duration says would end past the deadline (the
    clock here advances 10 s per look, so a chunk takes 10 s): the file keeps the whole chunks
    written before it, the CLI's summary counts the rows still missing, and a rerun without a
    deadline writes exactly what an uninterrupted run writes."""
    import itertools
    import types

    from train.data import regenerate as regen

    args = hf_args(target_dir, tmp_path, rows=5)
    whole = tmp_path / "whole.jsonl"
    assert main([*args, "--out", str(whole)]) == 0

    rows = [chat(i) for i in range(5)]
    sampling = {"temperature": 0.7, "top_p": 0.8, "max_new_tokens": 4, "seed": 0}

    def cut(deadline: float, name: str) -> tuple[int, Path]:
        clock = itertools.count(0.0, 10.0)
        monkeypatch.setattr(regen, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
        path = tmp_path / name
        n = regen.regenerate_responses(
            rows,
            str(target_dir),
            str(target_dir),
            sampling,
            path,
            2,
            on_bad_row="skip",
            deadline=deadline,
        )
        monkeypatch.undo()
        return n, path

    # Chunk 1 runs 0-10 s; chunk 2 would run 20-30 s: past a deadline of 25 s, so it never starts
    # (it would, were only its start checked); within 35 s it runs, and chunk 3 (at 40 s) not.
    assert cut(25.0, "early.jsonl")[0] == 2
    n, out = cut(35.0, "cut.jsonl")
    assert n == 4 and out.read_text() == "".join(whole.read_text().splitlines(True)[:4])

    assert main([*args, "--out", str(out), "--max-seconds", "0"]) == 0  # starts nothing
    summary = json.loads((tmp_path / "cut.jsonl.summary.json").read_text())
    assert summary["written_this_run"] == 0 and summary["source_rows_missing"] == 1
    assert main([*args, "--out", str(out)]) == 0
    assert out.read_text() == whole.read_text()
    summary = json.loads((tmp_path / "cut.jsonl.summary.json").read_text())
    assert summary["source_rows_missing"] == 0 and summary["max_seconds_this_run"] is None


def test_a_prompt_shared_by_rows_is_tokenized_once(target_dir):
    """Six answers per prompt cost one chat-template render per distinct prompt, and every row
    still gets the ids a render of its own would give."""
    from train.data import regenerate as regen

    tok = make_tokenizer()
    calls = []
    render = tok.apply_chat_template

    def counting(*a, **kw):
        calls.append(1)
        return render(*a, **kw)

    tok.apply_chat_template = counting
    rows = [chat(i) for i in range(3)] * 6
    chunks, skipped = regen._chunks(rows, 4, tok, {}, "skip")
    assert not skipped and len(calls) == 3
    flat = [entry for chunk in chunks for entry in chunk]
    assert [i for i, _, _ in flat] == list(range(18))
    for i, msgs, ids in flat:
        own = render(msgs, add_generation_prompt=True, return_dict=True)["input_ids"]
        assert ids == list(own) and msgs == regen.regeneration_prompt(rows[i], i)


def rows_by_index(path: Path) -> dict[int, dict]:
    return {r["row_index"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_shards_join_to_what_one_engine_writes(target_dir, tmp_path):
    """N engines (one process each, `--shard K/N`) answer disjoint chunks; joined, every row is
    what a single engine writes (the RNG is seeded per chunk), the answers OUT already held are
    resumed after, and a shard whose engine never started loses none of them."""
    common = hf_args(target_dir, tmp_path, rows=7)
    single = tmp_path / "single.jsonl"
    assert main([*common, "--out", str(single)]) == 0
    expect = rows_by_index(single)

    out = tmp_path / "all.jsonl"  # restored answers: rows 0, 1 (chunk 0) and 4 (chunk 2)
    out.write_text("".join(json.dumps(expect[i]) + "\n" for i in (0, 1, 4)))
    ready = tmp_path / "ready0"
    assert main([*common, "--out", str(out), "--shard", "0/3", "--ready-file", str(ready)]) == 0
    assert ready.exists()
    shard0 = json.loads(Path(f"{out}.shard0-of-3.summary.json").read_text())
    assert shard0["written_this_run"] == 1  # chunks 0 (restored) and 3 (row 6)
    assert shard0["source_rows_missing"] == 0
    assert main([*common, "--out", str(out), "--shard", "1/3"]) == 0  # chunk 1: rows 2, 3
    # shard 2 (chunk 2: rows 4, 5) never ran: row 4 survives from OUT, row 5 is missing.
    assert main(["--target", str(target_dir), "--out", str(out), "--join-shards", "3"]) == 0
    got = rows_by_index(out)
    assert sorted(got) == [0, 1, 2, 3, 4, 6]
    assert all(got[i] == expect[i] for i in got)
    assert not list(tmp_path.glob("all.jsonl.shard*"))
    summary = json.loads((tmp_path / "all.jsonl.summary.json").read_text())
    assert summary["rows"] == 6 and summary["engines"] == 3 and len(summary["shards"]) == 2
    assert summary["written_this_run"] == 3 and summary["source_rows_missing"] == 1


def test_shard_is_checked(target_dir, tmp_path, capsys):
    args = ["--target", str(target_dir), "--data", "x", "--out", str(tmp_path / "o")]
    for bad in ("3/3", "a/b", "1"):
        with pytest.raises(SystemExit):
            main([*args, "--shard", bad])
        assert "--shard" in capsys.readouterr().err
