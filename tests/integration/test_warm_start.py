"""`init_from=DIR`: a run that starts from an exported draft starts where that draft ended (its
weights, its draft -> target map), and a folder that is not this config's draft is refused before
anything is written."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from common.checkpoint import load_checkpoint
from common.model import DSparkDraftModel
from common.target import target_head_weights
from common.vocab import build_vocab_map
from tests.integration.test_distill import fast
from train.distill import main
from train.errors import SetupError
from train.init.warm_start import MIN_WARMUP_STEPS, rows_in, warm_start, warmup_note
from train.loop.objective import init_draft_weights
from train.schema import OptimCfg

VOCAB = "draft.draft_vocab_size=40"


@pytest.fixture(scope="module")
def first(target, tmp_path_factory) -> Path:
    """A first run's output folder: 12 steps on the target's own rows, reduced vocabulary."""
    out = tmp_path_factory.mktemp("first") / "run"
    assert main(fast(target, out, VOCAB, "trainer.max_steps=12", "optim.lr=3e-3")) == 0
    return out


def target_tables(target: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, torch_dtype=torch.float32)
    embed, head = target_head_weights(model)
    return embed.float(), head.float()


@pytest.fixture(scope="module")
def first_full_vocab(target, tmp_path_factory) -> Path:
    """The same with the target's whole vocabulary (the export leaves lm_head to the target)."""
    out = tmp_path_factory.mktemp("first_full") / "run"
    assert main(fast(target, out, "trainer.max_steps=3")) == 0
    return out


@pytest.mark.parametrize("run", ["first", "first_full_vocab"])
def test_warm_start_copies_every_tensor_of_the_export(target, run, request):
    first = request.getfixturevalue(run)
    embed, head = target_tables(target)
    want = load_checkpoint(first / "final", target_embed=embed, target_lm_head=head)
    fresh = DSparkDraftModel(want.config)
    assert not all(  # a fresh draft is not already the export
        torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), want.state_dict().values())
    )
    record = warm_start(fresh, str(first / "final"), embed, head)
    got = fresh.state_dict()
    for name, t in want.state_dict().items():
        assert torch.equal(got[name], t.to(got[name].dtype)), name
    assert record["path"] == str(first / "final") and len(record["weights_sha256"]) == 64


def test_a_run_from_an_export_starts_at_its_acceptance_and_keeps_its_vocab_map(
    target, first, tmp_path, capsys
):
    # Other data than the first run's (held-out rows as train rows): its own counts would give
    # another draft -> target map, but the export's map comes with the export's lm_head rows.
    out = tmp_path / "second"
    other = f"data.train={target}/data/heldout.jsonl"
    args = fast(target, out, VOCAB, other, f"init_from={first}/final", "trainer.max_steps=2")
    assert main(args) == 0
    assert "init_from with a 1-step warm-up" in capsys.readouterr().out  # 2 steps: the note
    before = json.loads((first / "summary.json").read_text())
    after = json.loads((out / "summary.json").read_text())
    # Held-out CE against the teacher (this random target's near-uniform distributions leave
    # TV-based tau flat): the second run's step 0 is where the first run ended, not where it began.
    fresh = before["eval_untrained"]["ce"]
    ended, started = before["eval"]["ce"], after["eval_untrained"]["ce"]
    assert fresh - ended > 0.01  # the first run learned something to carry over
    assert abs(started - ended) < 0.05 * (fresh - ended)  # bf16 export: nearly where it ended
    d2t_first = load_file(str(first / "final" / "model.safetensors"))["d2t"]
    d2t_second = load_file(str(out / "final" / "model.safetensors"))["d2t"]
    assert torch.equal(d2t_first, d2t_second)
    prov = json.loads((out / "final" / "provenance.json").read_text())
    assert prov["init_from"]["path"] == f"{first}/final"


def test_one_step_at_learning_rate_zero_evaluates_the_draft_as_it_is(target, first, tmp_path):
    # A trained draft is evaluated on any rows this way (the trainer has no evaluation-only
    # mode): the step must change no weight, so both evaluations agree
    # and the export is the draft it started from.
    out = tmp_path / "evaluated"
    other = f"data.heldout={target}/data/train.jsonl"
    args = fast(target, out, VOCAB, other, f"init_from={first}/final")
    assert main([*args, "trainer.max_steps=1", "optim.lr=0", "optim.markov_lr_scale=10"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval"]["ce"] == summary["eval_untrained"]["ce"]
    assert summary["eval"]["analytic_tau"] == summary["eval_untrained"]["analytic_tau"]
    before = load_file(str(first / "final" / "model.safetensors"))
    after = load_file(str(out / "final" / "model.safetensors"))
    assert before.keys() == after.keys()
    for name, t in before.items():
        assert torch.equal(after[name], t), name
    # and a step at a rate that is not zero does move it (the check above can fail)
    moved = tmp_path / "moved"
    args = fast(target, moved, VOCAB, other, f"init_from={first}/final")
    assert main([*args, "trainer.max_steps=1", "optim.lr=3e-3", "optim.warmup_ratio=0"]) == 0
    stepped = load_file(str(moved / "final" / "model.safetensors"))
    assert any(not torch.equal(stepped[n], t) for n, t in before.items())


def test_rows_in_finds_each_id_of_the_new_map_in_the_old():
    old, new = torch.tensor([2, 5, 7]), torch.tensor([5, 6, 7, 9])
    assert rows_in(old, new).tolist() == [1, -1, 2, -1]


def test_a_rebuilt_vocabulary_keeps_this_runs_map_and_carries_shared_markov_rows(target, first):
    embed, head = target_tables(target)
    src = load_checkpoint(first / "final", target_embed=embed, target_lm_head=head)
    counts = torch.randint(
        1, 1000, (src.config.vocab_size,), generator=torch.Generator().manual_seed(0)
    )
    vmap = build_vocab_map(counts, src.config.draft_vocab)
    old_ids, new_ids = src.draft_ids_in_target.tolist(), vmap.selected.tolist()
    shared = sorted(set(old_ids) & set(new_ids))
    assert shared and len(shared) < len(new_ids)  # some ids kept, some new: both paths run
    draft = DSparkDraftModel(src.config)
    init_draft_weights(draft)
    draft.init_from_target(embed, head, vmap.d2t, vmap.t2d)
    record = warm_start(draft, str(first / "final"), embed, head, vocab="rebuild")
    assert record["vocab"] == "rebuild"
    assert (record["vocab_ids_kept"], record["vocab_ids_new"]) == (
        len(shared),
        len(new_ids) - len(shared),
    )
    assert torch.equal(draft.d2t, vmap.d2t) and torch.equal(draft.t2d, vmap.t2d)
    assert torch.equal(draft.lm_head.weight, head[vmap.t2d].to(draft.lm_head.weight.dtype))
    w2_new, w2_old = draft.markov_head.markov_w2.weight, src.markov_head.markov_w2.weight
    for row, tid in enumerate(new_ids):  # a naive loop over target ids
        want = w2_old[old_ids.index(tid)] if tid in old_ids else torch.zeros_like(w2_new[row])
        assert torch.equal(w2_new[row], want.to(w2_new.dtype)), tid
    got, theirs = draft.state_dict(), src.state_dict()
    for name in theirs:
        if name not in ("d2t", "t2d", "lm_head.weight", "markov_head.markov_w2.weight"):
            assert torch.equal(got[name], theirs[name].to(got[name].dtype)), name


def test_a_run_with_a_rebuilt_vocabulary_exports_the_map_of_its_own_data(target, first, tmp_path):
    out = tmp_path / "second"
    other = f"data.train={target}/data/heldout.jsonl"
    args = [*fast(target, out, VOCAB, other, f"init_from={first}/final"), "init_from_vocab=rebuild"]
    assert main([*args, "trainer.max_steps=2"]) == 0
    own = torch.load(out / "vocab_map.pt")["d2t"]  # the map this run counted from its data
    d2t_first = load_file(str(first / "final" / "model.safetensors"))["d2t"]
    d2t_second = load_file(str(out / "final" / "model.safetensors"))["d2t"]
    assert torch.equal(d2t_second, own) and not torch.equal(d2t_second, d2t_first)
    prov = json.loads((out / "final" / "provenance.json").read_text())["init_from"]
    assert prov["vocab"] == "rebuild" and prov["vocab_ids_kept"] + prov["vocab_ids_new"] == 40


def test_an_unknown_vocabulary_mode_is_refused(target, first, tmp_path, capsys):
    args = fast(target, tmp_path / "o", VOCAB, f"init_from={first}/final", "init_from_vocab=merge")
    assert main(args) == 2
    assert "init_from_vocab='merge'" in capsys.readouterr().err


def test_a_different_draft_is_refused_naming_each_field(target, first, tmp_path, capsys):
    out = tmp_path / "second"
    args = fast(target, out, VOCAB, f"init_from={first}/final", "draft.markov_rank=4")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "init_from=" in err and "markov_rank: checkpoint 8 vs this run 4" in err
    assert not (out / "final").exists()


def test_a_folder_without_a_draft_is_refused(target, tmp_path, capsys):
    assert main(fast(target, tmp_path / "o", f"init_from={tmp_path}")) == 2
    assert "config.json" in capsys.readouterr().err


def test_warm_start_names_a_missing_folder():
    draft = DSparkDraftModel.__new__(DSparkDraftModel)
    with pytest.raises(SetupError, match="no config.json or model.safetensors"):
        warm_start(draft, "/nonexistent/draft", torch.zeros(1), torch.zeros(1))


def test_a_short_warm_up_after_init_from_draws_a_note():
    optim = OptimCfg(warmup_ratio=0.04)
    assert warmup_note(optim, round(MIN_WARMUP_STEPS / 0.04)) is None  # 20 steps: enough
    note = warmup_note(optim, 400)
    assert note and "16-step warm-up" in note and "optim.warmup_ratio=0.04 of 400 steps" in note
    assert warmup_note(OptimCfg(warmup_ratio=0.5), 40) is None


def test_a_truncated_export_is_one_line_naming_its_sizes(target, first, tmp_path, capsys):
    draft = tmp_path / "draft"
    shutil.copytree(first / "final", draft)
    weights = draft / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-64])
    out = tmp_path / "second"
    assert main(fast(target, out, VOCAB, f"init_from={draft}")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "SafetensorError" not in err
    assert err.strip().splitlines()[-1] == (
        f"[distill] cannot start: {weights} is truncated: expected {len(data)} bytes (from its "
        f"safetensors header), found {len(data) - 64}; copy or download it again"
    )
    assert not (out / "final").exists()
