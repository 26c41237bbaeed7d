"""Data pipeline tests: tiny byte-level BPE + ChatML template built here, no downloads, CPU, fast.

References are independent and naive: decoded assistant text, Python token counts, a plain list of
rendered samples, an uninterrupted loader run, a full regeneration run.
"""

import collections
import json
import logging

import datasets
import numpy as np
import pyarrow as pa
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from train.data import (
    BadRowError,
    ChatTemplateError,
    Renderer,
    build_dataloader,
    build_dataset,
    collate,
    count_loss_tokens,
    document_causal_mask,
    load_rows,
    pack_samples,
    tokenize_rows,
)
from train.data.pack import row_features
from train.data.regenerate import regenerate_responses
from train.data.report import DataReport

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_NO_GENERATION = CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", "")

CORPUS = [
    "Hello there, how are you today?",
    "I am fine, thank you. What is two plus two?",
    "The answer is four. Anything else I can help with?",
    "Write a haiku about the sea and the wind.",
    "Waves fold into foam; the wind carries salt and light.",
]


def make_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on CORPUS (every byte encodable) with the ChatML template above."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS * 10, trainer)
    t = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    t.chat_template = CHATML
    return t


@pytest.fixture(scope="session")
def tok():
    return make_tokenizer()


def chat(i: int, turns: int = 1) -> dict:
    msgs = [{"role": "system", "content": "Be brief."}]
    for t in range(turns):
        msgs += [
            {"role": "user", "content": f"{CORPUS[(i + t) % 5]} ({i}.{t})"},
            {"role": "assistant", "content": f"{CORPUS[(i + t + 2) % 5]} [{i}.{t}]"},
        ]
    return {"messages": msgs}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- load_rows ----------------------------------------------------------------------------------


def test_load_rows_local_formats(tmp_path):
    rows = [chat(i) for i in range(5)]
    ds = datasets.Dataset.from_list(rows)
    write_jsonl(tmp_path / "a.jsonl", rows)
    (tmp_path / "b.json").write_text(json.dumps(rows))
    ds.to_parquet(str(tmp_path / "c.parquet"))
    with pa.OSFile(str(tmp_path / "d.arrow"), "wb") as f, pa.ipc.new_stream(f, ds.data.schema) as w:
        w.write_table(ds.data.table)
    ds.save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "dir").mkdir()
    write_jsonl(tmp_path / "dir" / "x.jsonl", rows[:2])
    write_jsonl(tmp_path / "dir" / "y.jsonl", rows[2:])
    cache = str(tmp_path / "cache")
    for name in ("a.jsonl", "b.json", "c.parquet", "d.arrow", "saved", "dir"):
        got = load_rows(tmp_path / name, cache_dir=cache)
        assert isinstance(got, datasets.Dataset), name
        assert sorted(r["messages"][1]["content"] for r in got) == sorted(
            r["messages"][1]["content"] for r in rows
        ), name
    assert len(load_rows(tmp_path / "a.jsonl", max_rows=3, cache_dir=cache)) == 3
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_rows(tmp_path / "missing.jsonl")


# ---- rendering ----------------------------------------------------------------------------------


def test_assistant_mask_covers_exactly_assistant_content(tok):
    row = chat(3, turns=2)
    ids, mask = Renderer(tok)(row, 0)
    assert len(ids) == len(mask)
    spans, prev = [], False
    for t, m in zip(ids, mask):
        if m and not prev:
            spans.append([])
        if m:
            spans[-1].append(t)
        prev = m
    answers = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    # Each assistant turn is exactly one span: its content and the end-of-turn token it must emit.
    assert [tok.decode(s) for s in spans] == [a + "<|im_end|>" for a in answers]
    unsupervised = tok.decode([t for t, m in zip(ids, mask) if not m])
    for m in row["messages"]:
        if m["role"] != "assistant":
            assert m["content"] in unsupervised


@pytest.mark.parametrize("template", [None, "no_generation_markers"])
def test_a_regenerated_row_supervises_only_the_answer_the_target_wrote(tok, template):
    """A later-turn row that train.prepare.regenerate answered holds the source's earlier answers
    and the
    target's last one: only the last is supervised (both the marked and the incremental-render
    paths), the row says so, and a row without `regen` or with one answer is unchanged."""
    chat_template = None if template is None else CHATML_NO_GENERATION
    render = Renderer(tok, chat_template=chat_template).render
    row = chat(3, turns=3)
    regen = {**row, "regen": {"temperature": 0.0}}
    ids, full_mask = render(row, 0).ids, render(row, 0).mask
    out = render(regen, 0)
    assert out.ids == ids and out.notes == ["regen_final_turn"]
    last = row["messages"][-1]["content"] + "<|im_end|>"
    assert tok.decode([t for t, m in zip(ids, out.mask) if m]) == last
    assert all(f or not m for f, m in zip(full_mask, out.mask))  # a subset of the full mask
    one = chat(4, turns=1)
    assert render({**one, "regen": {}}, 0).mask == render(one, 0).mask
    assert render({**one, "regen": {}}, 0).notes == []


def test_sharegpt_renders_like_messages(tok):
    row = chat(1)
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    share = {
        "conversations": [
            {"from": names[m["role"]], "value": m["content"]} for m in row["messages"]
        ]
    }
    assert Renderer(tok)(share, 0) == Renderer(tok)(row, 0)


def test_template_without_generation_markers_masks_the_same_tokens(tok, tmp_path):
    """No markers: assistant spans come from incremental rendering and equal the marked ones."""
    tok2 = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, eos_token="<|im_end|>")
    tok2.chat_template = CHATML_NO_GENERATION
    tok2.name_or_path = "tiny-chatml"
    row = chat(0, turns=2)
    assert Renderer(tok2)(row, 0) == Renderer(tok)(row, 0)
    assert Renderer(tok, chat_template=CHATML_NO_GENERATION)(row, 0) == Renderer(tok)(row, 0)
    # The override still wins over the tokenizer's template.
    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    assert Renderer(tok2, chat_template=path)(row, 0) == Renderer(tok)(row, 0)
    tok3 = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, eos_token="<|im_end|>")
    tok3.name_or_path = "no-template"
    with pytest.raises(ChatTemplateError, match="no-template.*no chat template"):
        Renderer(tok3)(row, 0)


def test_text_rows_are_fully_supervised_and_end_with_eos(tok):
    ids, mask = Renderer(tok)({"text": CORPUS[0]}, 0)
    assert all(mask) and len(mask) == len(ids)
    assert ids[-1] == tok.eos_token_id
    assert tok.decode(ids[:-1]) == CORPUS[0]


@pytest.mark.parametrize(
    "row, problem",
    [
        ({"foo": "bar"}, "no `messages`"),
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "role='bot'"),
        (
            {"messages": [{"role": "user", "content": " "}, {"role": "assistant", "content": "a"}]},
            "empty",
        ),
        ({"messages": [{"role": "user", "content": ["x"]}]}, "must be a string"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
        ({"conversations": [{"from": "alien", "value": "x"}]}, "from='alien'"),
        ({"text": ""}, "empty"),
        ({"text": 3}, "must be a string"),
    ],
)
def test_malformed_row_names_index_and_problem(tok, row, problem):
    with pytest.raises(BadRowError, match=rf"row 7: .*{problem}"):
        Renderer(tok)(row, 7)


def test_bad_row_in_dataset_errors_or_skips(tok, caplog):
    rows = [chat(i) for i in range(6)]
    rows[4]["messages"][1]["role"] = "bot"  # a turn the default policy drops
    rows[2]["messages"] = rows[2]["messages"][:2]  # no assistant turn: the row is unusable
    ds = datasets.Dataset.from_list(rows)
    with pytest.raises(BadRowError, match=r"row 2: .*no assistant turn.*on_bad_row=skip"):
        tokenize_rows(ds, tok, on_bad_row="error")
    report = DataReport("rows")
    with caplog.at_level(logging.WARNING):
        out = tokenize_rows(ds, tok, report=report)
    assert list(out["row_index"]) == [0, 1, 3, 4, 5]
    assert "skipped 1 of 6 rows" in caplog.text and "row 2" in caplog.text
    assert (report.rows, dict(report.dropped), dict(report.turns)) == (
        6,
        {"no_assistant": 1},
        {"unknown_role": 1},
    )
    # Row 4 lost its user turn, nothing else: the same tokens as rendering it without that turn.
    kept = dict(rows[4], messages=[m for m in rows[4]["messages"] if m["role"] != "bot"])
    assert out[3]["input_ids"] == Renderer(tok)(kept, 4)[0]


# ---- packing ------------------------------------------------------------------------------------


def samples_for(tok, n=40):
    rows = [
        chat(i, turns=1 + i % 3) if i % 4 else {"text": CORPUS[i % 5] * (1 + i % 3)}
        for i in range(n)
    ]
    rows = [{"messages": r.get("messages"), "text": r.get("text")} for r in rows]
    return tokenize_rows(datasets.Dataset.from_list(rows), tok)


def docs_of(packed):
    """Every document of every packed row as (ids, mask) tuples, read back through doc_ids."""
    docs = []
    for r in packed:
        doc = np.asarray(r["doc_ids"])
        for d in range(doc.max() + 1):
            at = doc == d
            pos = np.asarray(r["position_ids"])[at]
            assert (pos == np.arange(at.sum())).all(), "positions must restart per document"
            docs.append(
                (tuple(np.asarray(r["input_ids"])[at]), tuple(np.asarray(r["loss_mask"])[at]))
            )
    return docs


@pytest.mark.parametrize("mode", ["pack", "bucket"])
def test_packing_keeps_every_token_once(tok, mode):
    samples = samples_for(tok)
    seq_len = max(map(len, samples["input_ids"])) + 3
    packed = pack_samples(samples, seq_len, pad_token_id=tok.pad_token_id, mode=mode, seed=1)
    arr = packed.with_format("numpy")[:]
    assert arr["input_ids"].shape[1] == seq_len and arr["loss_mask"].dtype == bool
    # Reference: the naive list of samples, with the documented first-token mask rule applied.
    naive = collections.Counter(
        (tuple(ids), (False, *map(bool, mask[1:])))
        for ids, mask in zip(samples["input_ids"], samples["loss_mask"])
    )
    assert collections.Counter(docs_of(packed)) == naive
    real = arr["doc_ids"] >= 0
    assert real.sum() == sum(map(len, samples["input_ids"]))
    assert not arr["loss_mask"][~real].any()
    assert (arr["input_ids"][~real] == tok.pad_token_id).all()
    if mode == "bucket":
        assert len(packed) == len(samples) and arr["doc_ids"].max() == 0
        assert (
            list(packed[0]["input_ids"][: len(samples[0]["input_ids"])]) == samples[0]["input_ids"]
        )
    else:
        assert len(packed) < len(samples)


def test_packing_is_deterministic_given_seed(tok):
    samples = samples_for(tok)
    pack = lambda seed: pack_samples(samples, 96, pad_token_id=0, seed=seed)["input_ids"]
    assert list(pack(3)) == list(pack(3))
    assert list(pack(3)) != list(pack(4))


def test_long_samples_truncate_or_split():
    # 10 supervised tokens; then 4 prompt tokens + 6 supervised (a chat-like sample).
    samples = datasets.Dataset.from_dict(
        {
            "input_ids": [list(range(1, 11)), list(range(11, 21))],
            "loss_mask": [[True] * 10, [False] * 4 + [True] * 6],
        }
    )
    docs = lambda how: sorted(
        d[0] for d in docs_of(pack_samples(samples, 4, pad_token_id=0, long_sample=how))
    )
    # Truncate keeps the first 4 tokens; the chat sample's first 4 are all prompt: dropped.
    assert docs("truncate") == [(1, 2, 3, 4)]
    # Split: independent chunks; (11..14) is dropped for the same reason, (9, 10) kept.
    assert docs("split") == [(1, 2, 3, 4), (5, 6, 7, 8), (9, 10), (15, 16, 17, 18), (19, 20)]


def test_build_dataset_from_jsonl(tok, tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [chat(i) for i in range(10)])
    rows = load_rows(tmp_path / "d.jsonl", cache_dir=str(tmp_path / "cache"))
    packed = build_dataset(rows, tok, 128, seed=0)
    assert set(packed.column_names) == {"input_ids", "loss_mask", "position_ids", "doc_ids"}
    assert packed.features == row_features(128)


# ---- loader -------------------------------------------------------------------------------------


def index_dataset(n: int, seq_len: int = 4) -> datasets.Dataset:
    """Row i has input_ids = [i]*seq_len, so batches can be read back as row indices."""
    return datasets.Dataset.from_dict(
        {
            "input_ids": [[i] * seq_len for i in range(n)],
            "loss_mask": [[True] * seq_len for _ in range(n)],
            "position_ids": [list(range(seq_len)) for _ in range(n)],
            "doc_ids": [[0] * seq_len for _ in range(n)],
        },
        features=row_features(seq_len),
    )


def rows_of(loader, epochs: int, stop_after: int | None = None) -> list[list[int]]:
    out = []
    while loader.epoch < epochs:
        for batch in loader:
            out.append(batch["input_ids"][:, 0].tolist())
            if stop_after is not None and len(out) == stop_after:
                return out
    return out


def test_batches_have_documented_dtypes_and_shapes():
    batch = next(iter(build_dataloader(index_dataset(10, seq_len=6), batch_size=4)))
    assert {k: (v.dtype, tuple(v.shape)) for k, v in batch.items()} == {
        "input_ids": (torch.int64, (4, 6)),
        "loss_mask": (torch.bool, (4, 6)),
        "position_ids": (torch.int64, (4, 6)),
        "doc_ids": (torch.int64, (4, 6)),
    }


@pytest.mark.parametrize("stop_after", [3, 5, 7])  # mid-epoch, end of epoch 0, mid-epoch 1
def test_resumed_loader_yields_exactly_the_remaining_batches(stop_after):
    ds = index_dataset(23)
    full = rows_of(build_dataloader(ds, 4, seed=5), epochs=3)
    first = build_dataloader(ds, 4, seed=5)
    seen = rows_of(first, epochs=3, stop_after=stop_after)
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint round trip
    resumed = build_dataloader(ds, 4, seed=5)
    resumed.load_state_dict(state)
    assert seen + rows_of(resumed, epochs=3) == full
    assert full[:5] != full[5:10], "epochs must be reshuffled"
    with pytest.raises(ValueError, match="seed"):
        build_dataloader(ds, 4, seed=6).load_state_dict(state)


@pytest.mark.parametrize("drop_last", [True, False])
def test_rank_sharding_partitions_indices(drop_last):
    n, world = 23, 3
    per_rank = [
        [
            i
            for b in rows_of(
                build_dataloader(
                    index_dataset(n), 2, seed=1, rank=r, world_size=world, drop_last=drop_last
                ),
                1,
            )
            for i in b
        ]
        for r in range(world)
    ]
    flat = [i for rank in per_rank for i in rank]
    assert len(flat) == len(set(flat)), "no row may be seen by two ranks"
    if drop_last:
        assert len(flat) == n // (2 * world) * 2 * world
        assert len({len(r) for r in per_rank}) == 1, "ranks must get equal batch counts"
    else:
        assert sorted(flat) == list(range(n))


def test_document_causal_mask():
    doc = torch.tensor([[0, 0, 1, 1, -1]])
    m = document_causal_mask(doc)[0, 0]
    expected = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 1]]
    ).bool()
    assert torch.equal(m, expected)
    assert (
        collate(
            {
                "input_ids": np.zeros((1, 2), np.int32),
                "loss_mask": np.ones((1, 2)),
                "position_ids": np.zeros((1, 2)),
                "doc_ids": np.zeros((1, 2)),
            }
        )["loss_mask"].dtype
        == torch.bool
    )


# ---- token counts -------------------------------------------------------------------------------


def test_count_loss_tokens_matches_naive_count(tok):
    samples = samples_for(tok)
    packed = pack_samples(samples, 160, pad_token_id=tok.pad_token_id, seed=0)
    for ds in (samples, packed):
        naive = [0] * len(tok)
        for ids, mask in zip(ds["input_ids"], ds["loss_mask"]):
            for t, m in zip(ids, mask):
                naive[t] += bool(m)
        got = count_loss_tokens(ds, len(tok), batch_size=7, progress=False)
        assert got.dtype == torch.int64 and got.tolist() == naive
    with pytest.raises(ValueError, match="vocab_size"):
        count_loss_tokens(samples, 10, progress=False)


# ---- regeneration -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_target(tok):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
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
    return Qwen3ForCausalLM(config).eval()


def regen_rows():
    rows = [chat(i) for i in range(4)]
    rows.append({"messages": chat(4)["messages"][:2]})  # ends with a user turn
    return rows


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_regeneration_resumes_to_identical_output(tok, tiny_target, tmp_path, temperature):
    rows = regen_rows()
    sampling = {"temperature": temperature, "top_p": 0.9, "max_new_tokens": 6, "seed": 11}
    full = tmp_path / "full.jsonl"
    assert regenerate_responses(rows, tiny_target, tok, sampling, full, batch_size=2) == 5
    lines = full.read_text().splitlines(keepends=True)
    recs = [json.loads(x) for x in lines]
    assert [r["row_index"] for r in recs] == list(range(5))
    for r, src in zip(recs, rows):
        prompt = (
            src["messages"][:-1] if src["messages"][-1]["role"] == "assistant" else src["messages"]
        )
        assert r["messages"][:-1] == prompt and r["messages"][-1]["role"] == "assistant"
        assert r["regen"]["temperature"] == temperature and r["regen"]["max_new_tokens"] == 6
        assert r["regen"]["finish_reason"] in ("stop", "length")
    # Resume after losing the last line, the last two (a half-written chunk), or a torn write.
    part = tmp_path / "part.jsonl"
    torn = [
        "".join(lines[:-1]) + lines[-1][:9],
        "".join(lines)[:-1],
    ]  # cut mid-line / before newline
    for kept in ("".join(lines[:-1]), "".join(lines[:-2]), *torn):
        part.write_text(kept)
        regenerate_responses(rows, tiny_target, tok, sampling, part, batch_size=2)
        assert part.read_text() == full.read_text()
    assert regenerate_responses(rows, tiny_target, tok, sampling, part, batch_size=2) == 0
    with pytest.raises(ValueError, match="new out_path"):
        regenerate_responses(rows, tiny_target, tok, {**sampling, "seed": 12}, part, batch_size=2)


def test_regeneration_greedy_matches_plain_generate(tok, tiny_target, tmp_path):
    rows = regen_rows()[:1]
    out = tmp_path / "g.jsonl"
    regenerate_responses(rows, tiny_target, tok, {"max_new_tokens": 5}, out, backend="auto")
    ids = tok.apply_chat_template(rows[0]["messages"][:-1], add_generation_prompt=True)["input_ids"]
    ref = tiny_target.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False)[
        0, len(ids) :
    ]
    ref = ref.tolist()
    if tok.eos_token_id in ref:
        ref = ref[: ref.index(tok.eos_token_id)]
    assert json.loads(out.read_text())["messages"][-1]["content"] == tok.decode(
        ref, skip_special_tokens=True
    )


@pytest.mark.vllm
def test_regeneration_vllm_backend_resumes(tok, tmp_path, monkeypatch):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; only read by the CPU backend
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # vLLM's CPU attention rejects tiny head dims
        max_position_embeddings=256,
        eos_token_id=tok.eos_token_id,
    )
    Qwen3ForCausalLM(config).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    rows, model = regen_rows(), str(tmp_path / "model")
    sampling = {"temperature": 0.8, "top_p": 0.9, "max_new_tokens": 6, "seed": 11}
    out = tmp_path / "out.jsonl"
    assert regenerate_responses(rows, model, tok, sampling, out, 2, backend="vllm") == 5
    full = out.read_text()
    assert all(json.loads(x)["regen"]["backend"] == "vllm" for x in full.splitlines())
    out.write_text("".join(full.splitlines(keepends=True)[:-2]))
    assert regenerate_responses(rows, model, tok, sampling, out, 2, backend="vllm") == 2
    assert out.read_text() == full


# ---- show_mask ----------------------------------------------------------------------------------


def test_show_mask_cli(tok, tmp_path, capsys):
    from train.prepare.show_mask import main

    tok.save_pretrained(tmp_path / "tok")
    data = write_jsonl(tmp_path / "d.jsonl", [chat(i) for i in range(6)])
    assert main(["--tokenizer", str(tmp_path / "tok"), "--data", str(data), "--row", "2"]) == 0
    out = capsys.readouterr().out
    assert f"[[{chat(2)['messages'][2]['content']}<|im_end|>]]" in out and "supervised (" in out
    args = ["--tokenizer", str(tmp_path / "tok"), "--data", str(data), "--seq-len", "200"]
    assert main(args) == 0
    assert "packed row 0" in capsys.readouterr().out
    assert main([*args, "--row", "99"]) == 2
