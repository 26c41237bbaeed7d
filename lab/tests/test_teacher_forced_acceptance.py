"""scripts/teacher_forced_acceptance.py: the acceptance the engine realizes at T=0, predicted from
one teacher-forced pass of the training path, must equal what the engine reports (a gap is a
serving or training bug: the two share no code past the draft's weights)."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from scripts.teacher_forced_acceptance import leading_matches, main, round_starts, walk
from tests.tiny import word_chat_rows, write_trained_target
from train.distill import main as distill


def test_walk_follows_the_engine_path_and_stops_at_the_answers_end():
    # answer of 8 tokens: anchor 0 accepts 2 -> anchor 3 accepts 0 -> anchor 4 accepts 3 -> 8: end
    counts = torch.tensor([2, 9, 9, 0, 3, 9, 9, 9])
    assert walk(counts) == (3, 5)
    assert walk(torch.tensor([4])) == (0, 0)  # a one-token answer: no round after the prefill


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A word-level target trained in seconds to walk a permutation, and a draft distilled from
    it for 40 steps: partial acceptance (tau about 2 of 5), so a wrong count shows."""
    root = tmp_path_factory.mktemp("tf")
    target = write_trained_target(root / "target")
    rows = word_chat_rows(400, seed=1)
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:360]))
    (root / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[360:]))
    overrides = [
        "+experiment=tiny",
        f"target.path={target}",
        "target.build_tiny=false",
        f"output_dir={root / 'run'}",
        f"data.train={root / 'train.jsonl'}",
        "data.regenerate.enabled=true",  # the target's own greedy answers
        "data.regenerate.temperature=0",
        "data.regenerate.max_new_tokens=8",
        "data.regenerate.batch_size=64",
        "data.seq_len=64",
        "trainer.micro_batch_size=8",
        "trainer.num_anchors=16",
        "trainer.max_steps=40",
        "trainer.progress=false",
        "trainer.threads=1",
        "draft.num_hidden_layers=1",
        "draft.block_size=4",
    ]
    assert distill(overrides) == 0
    return target, root / "run" / "final", root / "held.jsonl"


@pytest.mark.parametrize("max_tokens", [12, 5])  # answers end on EOS (7 tokens) / are cut
def test_engine_realizes_exactly_the_teacher_forced_walk(trained, tmp_path, max_tokens):
    target, ckpt, held = trained
    out = tmp_path / "tf.json"
    args = ["--target", str(target), "--checkpoint", str(ckpt), "--prompts", f"w={held}"]
    args += ["--num-prompts", "40", "--max-tokens", str(max_tokens), "--device", "cpu"]
    assert main([*args, "--threads", "1", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["prompts"] == 40 and row["walk_rounds"] > 40
    assert 1.5 < row["engine_tau"] < 4.5  # neither nothing nor everything accepted
    assert row["walk_tau"] == pytest.approx(row["engine_tau"], abs=1e-9)


def test_answer_agreement_agrees_with_the_walk_on_greedy_answers(trained, tmp_path):
    """On the target's greedy answer every answer token is the target's argmax, so the leading
    agreeing slots of lab/analysis/answer_agreement.py (draft vs the target's argmax) must be the
    accepted counts of the walk (draft vs the tokens): two code paths, one number."""
    from lab.analysis.answer_agreement import first_tokens, slot_agreement
    from lab.analysis.answer_agreement import main as agreement
    from scripts.eval_acceptance import evaluate, heldout_prompts, parse_prompt_files
    from scripts.teacher_forced_acceptance import accepted_counts
    from serve.engine import Engine
    from serve.engine.options import EngineOptions

    target, ckpt, held = trained
    engine = Engine.from_options(
        EngineOptions(target=str(target), checkpoint=str(ckpt), device="cpu", max_num_seqs=24)
    )
    prompts = heldout_prompts(str(target), engine.tokenizer, 24, parse_prompt_files([f"w={held}"]))
    (ps,) = prompts.values()
    outs = evaluate(engine, ps, 0.0, 12, 0)["outputs"]
    checked = 0
    for prompt, answer in zip(ps, outs, strict=True):
        hits = slot_agreement(engine, prompt, answer)
        counts = accepted_counts(engine, prompt, answer)
        nd = hits.shape[1]
        for i in range(len(answer) - nd - 1):  # anchors whose whole block lies in the answer
            lead = int(hits[i].clamp(min=0).cumprod(0).sum())
            assert lead == int(counts[i]), (i, hits[i], counts[i])
            checked += 1
    assert checked > 20
    h = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1]])
    # 3 answer tokens: anchor 0's slots propose tokens 1, 2 (and 3: past), anchor 1's token 2
    assert first_tokens(h, 3).tolist() == [[1, 1, -1], [1, -1, -1]]
    rows = tmp_path / "rows.jsonl"
    assert agreement(["--target", str(target), "--checkpoint", str(ckpt), "--rows", str(held)]) == 2
    held_rows = [json.loads(x) for x in held.read_text().splitlines()][: len(outs)]
    text = [engine.tokenizer.decode(o, skip_special_tokens=True) for o in outs]
    answered = [
        {"messages": [*r["messages"], {"role": "assistant", "content": t}]}
        for r, t in zip(held_rows, text, strict=True)
    ]
    rows.write_text("".join(json.dumps(r) + "\n" for r in answered))
    out = tmp_path / "agree.json"
    args = ["--target", str(target), "--checkpoint", str(ckpt), "--rows", str(rows)]
    assert (
        agreement([*args, "--num-rows", "8", "--answer-tokens", "4", "100", "--json", str(out)])
        == 0
    )
    res = json.loads(out.read_text())["results"]
    assert [r["answer_tokens"] for r in res] == [4, 100] and res[0]["anchors"] < res[1]["anchors"]
    assert all(0.0 <= x <= 1.0 for r in res for x in r["per_slot"])


def test_top1_probability_matches_a_float64_softmax_with_and_without_a_softcap():
    from lab.analysis.acceptance_by_target_confidence import CHUNK, top1_probability

    g = torch.Generator().manual_seed(0)
    final, head = torch.randn(CHUNK + 37, 16, generator=g), torch.randn(50, 16, generator=g)
    for cap in (None, 3.0):
        z = final.double() @ head.double().T
        z = cap * torch.tanh(z / cap) if cap else z
        ref = z.softmax(-1).max(-1).values
        assert torch.allclose(top1_probability(final, head, cap).double(), ref, atol=1e-6)


def test_rounds_ending_on_counts_the_first_miss_of_each_round_only():
    from lab.analysis.acceptance_by_target_confidence import rounds_ending_on

    hit = torch.tensor(
        [[1, 0, 0], [0, 0, 0], [0, 1, 1], [1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool
    )
    starts = round_starts(leading_matches(hit))
    assert starts == [(0, 1), (2, 0), (3, 2)]  # by hand: anchors 0, 0 + 1 + 1, 2 + 0 + 1
    cells = torch.zeros_like(hit)
    cells[0, 1] = cells[3, 2] = True  # two rounds end here
    cells[1, 0] = cells[0, 0] = True  # no round starts at 1; slot 0 of anchor 0 was accepted
    assert rounds_ending_on(cells, starts) == 2
    assert rounds_ending_on(torch.ones(1, 3, dtype=torch.bool), [(0, 3)]) == 0  # no miss


def test_confidence_bins_account_for_every_slot_and_round(trained, tmp_path):
    """Cell and round-end shares sum to one; the walk equals teacher_forced_acceptance's; a draft
    made right at more positions (a lower floor) never walks shorter, and right everywhere (floor
    0) walks the whole block each round."""
    from lab.analysis.acceptance_by_target_confidence import bin_index
    from lab.analysis.acceptance_by_target_confidence import main as by_confidence

    assert bin_index(torch.tensor([0.1, 0.5, 0.79, 0.8, 0.99]), [0.0, 0.5, 0.8]).tolist() == [
        0,
        1,
        1,
        2,
        2,
    ]
    target, ckpt, held = trained
    common = ["--target", str(target), "--checkpoint", str(ckpt), "--prompts", f"w={held}"]
    common += ["--num-prompts", "40", "--max-tokens", "12", "--device", "cpu"]
    out, tf = tmp_path / "conf.json", tmp_path / "tf.json"
    assert by_confidence([*common, "--floors", "0.5", "0.9", "--json", str(out)]) == 0
    assert main([*common, "--json", str(tf)]) == 0
    (row,), (ref,) = json.loads(out.read_text()), json.loads(tf.read_text())
    assert row["walk_tau"] == pytest.approx(ref["walk_tau"], abs=1e-9)
    bins = row["bins"]
    assert [b["floor"] for b in bins] == [0.0, 0.5, 0.9]
    assert sum(b["cell_share"] for b in bins) == pytest.approx(1.0)
    assert sum(b["round_end_share"] for b in bins) == pytest.approx(1.0)
    assert sum(b["slot0_share"] for b in bins) == pytest.approx(1.0)
    # over all bins, slot 0's agreement is teacher_forced_acceptance's slot 0 over every anchor
    slot0 = sum(b["slot0_share"] * b["slot0_draft_agreement"] for b in bins)
    assert slot0 == pytest.approx(ref["every_anchor_conditional"][0], abs=1e-6)
    assert 0.0 < slot0 < 1.0
    taus = [b["walk_tau_if_right_where_target_at_least_floor"] for b in bins]
    assert taus == sorted(taus, reverse=True) and taus[-1] >= row["walk_tau"] - 1e-9
    assert taus[0] > row["walk_tau"]  # the fixture's draft misses: a perfect one walks further
    # a full-vocabulary draft: nothing outside it, so its walk is the walk as is
    assert row["answer_tokens_outside_draft_vocab"] == 0.0
    assert row["round_ends_outside_draft_vocab"] == 0.0
    assert row["walk_tau_if_right_outside_draft_vocab"] == pytest.approx(row["walk_tau"])


def test_markov_bias_scale_splits_the_fused_logits_exactly(trained, tmp_path):
    """markov_bias_scale.py takes the backbone's logits and the Markov head's bias apart
    (`lm_head(h)`, `markov_w2(u)`) to rescale the bias; at scale 1 its T=0 counts must be the
    walk's (`block_logits`, one fused matmul over `[h; u]`), and at scale 0 those of the backbone
    alone (the head's output rows zeroed)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from lab.analysis.markov_bias_scale import answer_ids, base_and_bias, scaled_matches
    from lab.analysis.markov_bias_scale import main as bias_scale
    from scripts.eval_acceptance import evaluate
    from scripts.teacher_forced_acceptance import accepted_counts
    from serve.engine import Engine
    from serve.engine.options import EngineOptions

    target, trained_ckpt, held = trained
    # 40 steps leave the head's output near its zero start; 30x of it moves the argmax, so a
    # scale the split ignored would show
    ckpt = tmp_path / "draft"
    shutil.copytree(trained_ckpt, ckpt)
    weights = load_file(ckpt / "model.safetensors")
    (key,) = [k for k in weights if k.endswith("markov_w2.weight")]
    weights[key] = weights[key] * 30
    save_file(weights, ckpt / "model.safetensors")
    engine = Engine.from_options(
        EngineOptions(
            target=str(target),
            checkpoint=str(ckpt),
            device="cpu",
            draft_sampling="greedy",
            max_num_seqs=8,
            max_model_len=64,
        )
    )
    nd, tok = engine.num_spec, engine.tokenizer
    rows = []
    for i, line in enumerate(held.read_text().splitlines()[:24]):
        msgs = json.loads(line)["messages"]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True)
        out = evaluate(engine, [list(ids["input_ids"])], 0.0, 12, 0)["outputs"][0]
        answer = {"role": "assistant", "content": tok.decode(out, skip_special_tokens=True)}
        rows.append({"messages": [*msgs, answer], "split": "heldout" if i % 2 else "train"})
    pairs = [answer_ids(tok, r, 768, 512) for r in rows if r["split"] == "heldout"]
    pairs = [(p, a) for p, a in pairs if len(a) > nd]
    assert len(pairs) > 5, "too few held-out answers longer than a block"
    w2 = engine.draft_model.markov_head.markov_w2.weight
    expect = {}
    for s in (1.0, 0.0):  # the walk with the head as trained, then with its output zeroed
        if s == 0.0:
            kept = w2.detach().clone()
            w2.data.zero_()
        expect[s] = [accepted_counts(engine, p, a)[: len(a) - nd] for p, a in pairs]
    w2.data.copy_(kept)
    assert any(not torch.equal(a, b) for a, b in zip(expect[1.0], expect[0.0], strict=True))
    for (p, a), c1, c0 in zip(pairs, expect[1.0], expect[0.0], strict=True):
        base, bias, labels, _ = base_and_bias(engine, p, a)
        assert torch.equal(scaled_matches(engine, base, bias, labels, 1.0), c1)
        assert torch.equal(scaled_matches(engine, base, bias, labels, 0.0), c0)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "scale.json"
    args = ["--target", str(target), "--checkpoint", str(ckpt)]
    args += ["--rows", str(tmp_path / "rows.jsonl"), "--splits", "heldout", "--scales", "0", "1"]
    # the head cut to its full rank is the head (up to float rounding); to rank 1 it keeps less
    rank = engine.draft_model.markov_head.markov_w1.weight.shape[1]
    args += ["--ranks", str(rank), "1"]
    assert bias_scale([*args, "--device", "cpu", "--json", str(out)]) == 0
    (res,) = json.loads(out.read_text())
    assert res["rows"] == len(pairs)
    for s in (0.0, 1.0):
        want = 1 + float(torch.cat(expect[s]).float().mean())
        assert res["scales"][str(s)]["tau"] == pytest.approx(want, abs=1e-9)
    full, one = res["ranks"][str(rank)], res["ranks"]["1"]
    assert full["energy_share"] == pytest.approx(1.0) and 0 < one["energy_share"] < 1
    assert full["tau"] == pytest.approx(res["scales"]["1.0"]["tau"], abs=0.01)
    with pytest.raises(SystemExit, match="the head's rank is"):
        bias_scale([*args[:-3], "--ranks", str(rank + 1), "--device", "cpu"])


def test_eval_acceptance_drafts_fewer_a_round_with_num_spec(trained, tmp_path, capsys):
    """--num-spec 2 on a block-4 draft: rows of two slots, each round drafting two; more than
    the block is refused by the engine (serve.evaluate's exit 2, one line naming the limit)."""
    from scripts.eval_acceptance import main as eval_acceptance

    target, ckpt, held = trained
    args = ["--target", str(target), "--draft", f"d={ckpt}", "--prompts", f"w={held}"]
    args += ["--temperatures", "0", "--num-prompts", "12", "--max-tokens", "12", "--threads", "1"]
    rows = {}
    for n in (2, None):
        out = tmp_path / f"n{n}.json"
        extra = ["--num-spec", str(n)] if n else []
        assert eval_acceptance([*args, *extra, "--device", "cpu", "--json", str(out)]) == 0
        (rows[n],) = json.loads(out.read_text())
    assert len(rows[2]["accepted_per_pos"]) == 2 and len(rows[None]["accepted_per_pos"]) == 4
    assert rows[2]["draft_tokens"] == 2 * rows[2]["drafts"]
    # The same greedy answers in rounds of at most 3 tokens: never fewer rounds than with 5.
    assert rows[2]["drafts"] >= rows[None]["drafts"] and rows[2]["mean_acceptance_length"] <= 3
    capsys.readouterr()
    assert eval_acceptance([*args, "--num-spec", "5", "--device", "cpu"]) == 2
    assert "num_speculative_tokens=5 exceeds" in capsys.readouterr().err


def test_eval_acceptance_keeps_the_pairs_it_finished_in_the_order_given(
    trained, tmp_path, monkeypatch
):
    """Every draft runs on a prompt set before the next set, the sets in the order --prompts names
    them (the criterion's first), and serve.evaluate writes its report after every row: an
    evaluation that dies on the second set (a machine taken back mid-stage) leaves the first set's
    pair, whole, in OUT.json.d/eval.json (the old-format --json is written only when all ran)."""
    import scripts.eval_acceptance as ev
    import serve.evaluate

    target, ckpt, held = trained
    out = tmp_path / "rows.json"
    args = ["--target", str(target), "--draft", f"d={ckpt}", "--draft", f"e={ckpt}"]
    args += ["--prompts", f"zz={held}", f"aa={held}", "--temperatures", "0"]
    args += ["--num-prompts", "4", "--max-tokens", "8", "--threads", "1"]
    args += ["--device", "cpu", "--json", str(out)]
    assert ev.main(args) == 0
    done = [(r["domain"], r["draft"]) for r in json.loads(out.read_text())]
    assert done == [("zz", "d"), ("zz", "e"), ("aa", "d"), ("aa", "e")]
    real, calls = serve.evaluate.evaluate, []

    def dies_on_the_second_set(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("machine taken back")
        return real(*a, **k)

    monkeypatch.setattr(serve.evaluate, "evaluate", dies_on_the_second_set)
    out.unlink()
    shutil.rmtree(tmp_path / "rows.json.d")
    with pytest.raises(RuntimeError, match="taken back"):
        ev.main(args)
    assert not out.exists()
    rows = json.loads((tmp_path / "rows.json.d" / "eval.json").read_text())["rows"]
    got = [(r["domain"], r["draft"], r["prompts"]) for r in rows]
    assert got == [("zz", "d", 4), ("zz", "e", 4)]
    assert rows[0]["mean_acceptance_length"] == rows[1]["mean_acceptance_length"]  # one draft
