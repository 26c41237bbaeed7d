"""`python -m train.distill`: config composition, bad input, end-to-end export, exact resume."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from common.checkpoint_files import PROVENANCE_NAME
from common.config import DSparkConfig
from common.contract import check_checkpoint
from common.target_fit import checkpoint_fit_problems
from tests.slow_steps import slow_steps
from train.config_io import CONFIG_DIR, BadConfig, compose_config
from train.distill import main
from train.init.draft_config import MASK_KEYS
from train.schema import DistillCfg, DraftCfg

EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
REPO = Path(__file__).resolve().parents[2]


def fast(target: Path, out: Path, *extra: str) -> list[str]:
    return [
        "+experiment=tiny",
        f"target.path={target}",
        "target.build_tiny=false",
        f"output_dir={out}",
        "data.seq_len=64",
        "trainer.micro_batch_size=2",
        "trainer.num_anchors=8",
        "trainer.max_steps=4",
        "trainer.eval_batches=1",
        "trainer.progress=false",
        "draft.num_hidden_layers=1",
        "draft.markov_rank=8",
        "trainer.threads=1",
        *extra,
    ]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes(name):
    cfg = compose_config([f"+experiment={name}", "data.train=rows.jsonl"])
    assert cfg.experiment_name
    assert cfg.draft.block_size >= 2


def _keys(cls, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        nested = dataclasses.is_dataclass(hints[f.name])
        out += _keys(hints[f.name], f"{prefix}{f.name}.") if nested else [prefix + f.name]
    return out


def test_cli_surface_is_frozen():
    """Every key of `python -m train.distill` (a rename or removal breaks users' commands and
    experiment files; a new key is added here on purpose)."""
    assert _keys(DistillCfg) == [
        "experiment_name",
        "output_dir",
        "seed",
        "resume",
        "overwrite",
        "init_from",
        "init_from_vocab",
        "init_layers_from_target",
        "init_markov_from_embedding",
        "print_config",
        "dry_run",
        "target.path",
        "target.dtype",
        "target.build_tiny",
        "target.tiny_minutes",
        "target.prepare",
        "target.trust_remote_code",
        "draft.num_hidden_layers",
        "draft.hidden_size",
        "draft.intermediate_size",
        "draft.num_attention_heads",
        "draft.num_key_value_heads",
        "draft.head_dim",
        "draft.block_size",
        "draft.markov_rank",
        "draft.markov_head_type",
        "draft.enable_confidence_head",
        "draft.confidence_head_with_markov",
        "draft.draft_vocab_size",
        "draft.sample_from_anchor",
        "draft.dspark_draft_topk",
        "draft.target_layer_ids",
        "draft.mask_token",
        "draft.mask_token_id",
        "data.train",
        "data.heldout",
        "data.split",
        "data.max_rows",
        "data.heldout_max_rows",
        "data.seq_len",
        "data.packing",
        "data.chat_template",
        "data.chat_template_kwargs",
        "data.on_bad_row",
        "data.max_bad_row_share",
        "data.num_proc",
        "data.regenerate.enabled",
        "data.regenerate.backend",
        "data.regenerate.temperature",
        "data.regenerate.top_p",
        "data.regenerate.max_new_tokens",
        "data.regenerate.batch_size",
        "loss.ce_weight",
        "loss.l1_weight",
        "loss.bce_weight",
        "loss.decay",
        "loss.chunk_tokens",
        "loss.confidence_detach",
        "loss.share_teacher",
        "optim.lr",
        "optim.weight_decay",
        "optim.beta1",
        "optim.beta2",
        "optim.eps",
        "optim.warmup_ratio",
        "optim.min_lr_ratio",
        "optim.clip",
        "optim.schedule",
        "optim.decay_ratio",
        "optim.markov_lr_scale",
        "optim.markov_weight_decay",
        "trainer.device",
        "trainer.mixed_precision",
        "trainer.distributed",
        "trainer.micro_batch_size",
        "trainer.grad_accum",
        "trainer.max_steps",
        "trainer.max_seconds",
        "trainer.schedule_to_time",
        "trainer.num_anchors",
        "trainer.anchor_sampling",
        "trainer.eval_every",
        "trainer.eval_batches",
        "trainer.eval_answer_head",
        "trainer.save_every",
        "trainer.keep_last",
        "trainer.log_every",
        "trainer.num_workers",
        "trainer.progress",
        "trainer.print_every",
        "trainer.threads",
        "trainer.max_bad_batches",
        "trainer.draft_attention",
        "trainer.target_attention",
        "trainer.compile_draft",
        "trainer.compile_target",
        "trainer.compile_loss",
        "trainer.compile_cache",
        "logger.backend",
        "logger.project",
        "logger.entity",
        "logger.mode",
        "logger.run_name",
        "export.dtype",
        "export.include_embed",
        "export.include_lm_head",
        "export.speculators",
        "hub.repo_id",
        "hub.private",
        "extra",
    ]


def test_every_draft_key_but_the_mask_choice_is_a_dspark_config_field():
    """train.init.draft_config.draft_config copies DraftCfg into DSparkConfig by field name."""
    draft = {f.name for f in dataclasses.fields(DraftCfg)} - set(MASK_KEYS)
    assert draft <= {f.name for f in dataclasses.fields(DSparkConfig)}


def test_draft_defaults_are_dspark_configs():
    """One place for the draft's defaults: every DraftCfg key that is a DSparkConfig field
    defaults as DSparkConfig does, but the ones resolved from the target (null here); the dspark
    preset (configs/draft/dspark.yaml) says the same."""
    import yaml

    from_target = {
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "target_layer_ids",
    }
    ours = {f.name: f.default for f in dataclasses.fields(DraftCfg) if f.name not in MASK_KEYS}
    theirs = {f.name: f.default for f in dataclasses.fields(DSparkConfig)}
    shared = set(ours) - from_target
    assert len(shared) == 9  # a key added to both is compared too
    assert {k: ours[k] for k in shared} == {k: theirs[k] for k in shared}
    assert all(ours[k] is None for k in from_target)
    preset = yaml.safe_load((CONFIG_DIR / "draft" / "dspark.yaml").read_text())
    assert preset == {k: theirs[k] for k in preset} and set(preset) <= shared


def test_experiments_exist_and_dflash_is_the_ablation():
    assert {"tiny", "qwen3_8b_dspark", "dflash", "tiny_dflash"} <= set(EXPERIMENTS)
    d = compose_config(["+experiment=dflash", "data.train=x"])
    s = compose_config(["+experiment=qwen3_8b_dspark", "data.train=x"])
    assert d.draft.markov_rank == 0 and not d.draft.enable_confidence_head
    assert s.draft.markov_rank == 256 and s.draft.enable_confidence_head
    assert s.draft.target_layer_ids == [1, 9, 17, 25, 33]
    assert compose_config(["+experiment=tiny", "trainer.max_steps=7"]).trainer.max_steps == 7
    # the 1.5B recipe's twin differs from its DSpark draft in the two heads alone
    q = compose_config(["+experiment=qwen25_coder_1p5b", "data.train=x"])
    qd = compose_config(["+experiment=qwen25_coder_1p5b_dflash", "data.train=x"])
    assert qd.draft.markov_rank == 0 and not qd.draft.enable_confidence_head
    heads = {"markov_rank", "enable_confidence_head", "confidence_head_with_markov"}
    differ = {k for k in q.draft if k not in heads and q.draft[k] != qd.draft[k]}
    assert differ == set() and qd.draft.num_hidden_layers == 3
    own = ("draft", "experiment_name", "output_dir")  # output_dir follows the name
    assert {k: v for k, v in q.items() if k not in own} == {
        k: v for k, v in qd.items() if k not in own
    }


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.nope=1", "trainer.nope"),
        ("trainer.max_steps=abc", "trainer.max_steps"),
        ("draft.markov_head_type=lstm", "draft.markov_head_type"),
        ("trainer.max_steps=0", "trainer.max_steps"),
        ("trainer.max_seconds=-1", "trainer.max_seconds"),
    ],
)
def test_bad_override_exits_2_naming_the_key(override, key, capsys):
    with pytest.raises(BadConfig, match=key.replace(".", r"\.")):
        compose_config(["+experiment=tiny", override])
    assert main(["+experiment=tiny", override]) == 2
    assert key in capsys.readouterr().err


def test_unknown_experiment_exits_2(capsys):
    assert main(["+experiment=does_not_exist"]) == 2
    assert "does_not_exist" in capsys.readouterr().err


def test_an_experiment_in_a_searchpath_folder_of_ones_own_composes(tmp_path, capsys):
    # Hydra's way to keep experiments outside the repo: hydra.searchpath=[file://DIR] and
    # DIR/experiment/NAME.yaml; the override check must look there too
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - tiny\nexperiment_name: mine\ntrainer:\n"
        "  max_steps: 11\n"
    )
    path = f"hydra.searchpath=[file://{tmp_path}]"
    cfg = compose_config([path, "+experiment=mine"])
    assert (cfg.experiment_name, cfg.trainer.max_steps) == ("mine", 11)
    assert main([path, "+experiment=mien"]) == 2
    err = one_line_error(capsys)
    assert "unknown experiment 'mien'; did you mean mine?" in err
    assert f"{tmp_path}/experiment/" in err
    assert main(["+experiment=mine"]) == 2  # without the searchpath it is not found


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("plus", ["", "+", "++"])
def test_a_key_outside_the_schema_is_refused_with_or_without_plus(plus, capsys):
    assert main(["+experiment=tiny", f"{plus}trainer.max_stepz=3"]) == 2
    assert one_line_error(capsys) == (
        "[distill] bad config: unknown key trainer.max_stepz; did you mean trainer.max_steps? "
        "(every key: docs/train.md; the common ones: python -m train.distill --help)"
    )
    assert main(["+experiment=tiny", f"{plus}lr=1e-3"]) == 2  # a right name in no section
    assert "unknown key lr; did you mean optim.lr?" in one_line_error(capsys)
    # a schema key takes any of the three forms
    assert compose_config(["+experiment=tiny", f"{plus}trainer.max_steps=7"]).trainer.max_steps == 7


def test_the_free_form_dicts_take_any_key():
    cfg = compose_config(["+experiment=tiny", "+data.chat_template_kwargs.enable_thinking=false"])
    assert cfg.data.chat_template_kwargs == {"enable_thinking": False}
    assert compose_config(["+experiment=tiny", "+extra.note=x"]).extra == {"note": "x"}


@pytest.mark.parametrize(
    "override, expected",
    [
        ("trainer.max_steps=abc", "trainer.max_steps=abc: expected an integer"),
        ("data.seq_len=1.5", "data.seq_len=1.5: expected an integer"),
        ("trainer.progress=maybe", "trainer.progress=maybe: expected true or false"),
        ("optim.lr=fast", "optim.lr=fast: expected a number"),
        (
            "draft.target_layer_ids=[1,x]",
            "draft.target_layer_ids=[1,x]: expected a list of integers, e.g. [1, 2] or null",
        ),
        ("resume=maybe", "resume='maybe': choose one of false, true, auto"),
    ],
)
def test_a_wrong_type_names_the_expected_type(override, expected, capsys):
    assert main(["+experiment=tiny", override]) == 2
    assert one_line_error(capsys) == f"[distill] bad config: {expected}"


def test_an_unknown_experiment_lists_every_choice(capsys):
    assert main(["+experiment=tinyy"]) == 2
    err = one_line_error(capsys)
    assert err.startswith("[distill] bad config: unknown experiment 'tinyy'; did you mean tiny?")
    assert err.endswith(f"Choose one of: {', '.join(EXPERIMENTS)} (configs/experiment/)")
    assert main(["target=hff"]) == 2
    assert "unknown target 'hff'; did you mean hf? Choose one of: hf," in one_line_error(capsys)
    # experiment=NAME without `+` is taken as +experiment=NAME
    assert compose_config(["experiment=tiny"]).experiment_name == "tiny"


def test_help_prints_usage_and_no_argument_exits_2():
    """The real command line: --help exits 0 with the usage, a bare command prints it and exits 2
    (it used to start a 100-step run into outputs/default)."""
    run = [sys.executable, "-m", "train.distill"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    helped = subprocess.run([*run, "--help"], cwd=REPO, capture_output=True, text=True, env=env)
    assert helped.returncode == 0, helped.stderr
    usage = helped.stdout
    assert usage.startswith("usage: python -m train.distill +experiment=NAME")
    for group in ("+experiment=", "target=", "trainer=", "data="):
        assert f"\n  {group}" in usage, group
    assert all(name in usage for name in EXPERIMENTS)
    assert "data.train=FILE" in usage and "resume=auto" in usage and "docs/train.md" in usage
    bare = subprocess.run(run, cwd=REPO, capture_output=True, text=True, env=env)
    assert bare.returncode == 2 and bare.stderr.strip() == usage.strip() and bare.stdout == ""


def test_resume_true_with_nothing_to_resume_names_the_folder(target, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(fast(target, out, "resume=true")) == 2
    assert one_line_error(capsys) == (
        f"[distill] cannot start: resume=true but {out / 'checkpoints'} holds no checkpoint to "
        "continue: leave resume out to start a run there, or pass resume=auto (continues if there "
        "is one, else starts)"
    )


def test_resume_auto_starts_when_there_is_nothing_and_continues_when_there_is(
    target, tmp_path, capsys
):
    out = tmp_path / "run"
    assert main(fast(target, out, "resume=auto", "trainer.max_steps=2")) == 0
    assert f"resume=auto: no checkpoint in {out / 'checkpoints'}, starting afresh" in (
        capsys.readouterr().out
    )
    assert main(fast(target, out, "resume=auto", "trainer.max_steps=2")) == 0
    assert "resume=auto: continuing" in capsys.readouterr().out


def test_an_empty_or_partial_target_folder_is_one_line(target, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(fast(empty, tmp_path / "o")) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"[distill] cannot start: target folder {empty} is empty: missing ")
    assert "sentencepiece" not in err
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text((target / "config.json").read_text())
    assert main(fast(partial, tmp_path / "o2")) == 2
    assert (
        "is incomplete: missing weights (model.safetensors or pytorch_model.bin), a tokenizer"
        in (one_line_error(capsys))
    )


@pytest.mark.parametrize(
    "extra, message",
    [
        (["draft.target_layer_ids=[3]"], "target_layer_ids"),  # final layer of a 4-layer target
        (["draft.target_layer_ids=[9]"], "target_layer_ids"),
        (["draft.mask_token=<|nope|>"], "mask_token"),
        (["draft.mask_token_id=100000"], "mask_token_id"),
    ],
)
def test_bad_draft_against_target_stops_before_writing(target, tmp_path, extra, message, capsys):
    out = tmp_path / "out"
    assert main(fast(target, out, *extra)) == 2
    assert message in capsys.readouterr().err
    assert not (out / "checkpoints").exists() and not (out / "final").exists()


def test_gpu_speed_settings_are_refused_on_the_cpu_before_writing(target, tmp_path, capsys):
    """trainer.draft_attention / target_attention = flex and compile_draft are GPU-only: on the
    CPU the run stops naming them (exit 2) instead of failing inside a backward."""
    out = tmp_path / "out"
    extra = ("trainer.device=cpu", "trainer.draft_attention=flex", "trainer.compile_draft=true")
    compiled = ("trainer.compile_target=true", "trainer.compile_loss=true")
    assert main(fast(target, out, *extra, *compiled)) == 2
    err = capsys.readouterr().err
    assert "trainer.draft_attention=flex" in err and "trainer.compile_draft=true" in err
    assert all(flag in err for flag in compiled)
    assert not (out / "checkpoints").exists() and not (out / "final").exists()
    with pytest.raises(BadConfig, match=r"trainer\.target_attention"):
        compose_config(["+experiment=tiny", "trainer.target_attention=flash"])


def test_speed_settings_reach_the_models():
    """apply_speed_settings: defaults leave sdpa everywhere; flex on the GPU path sets the draft's
    block attention and the target's implementation, and a later default call undoes the
    target's (the benchmark reuses one target across variants)."""
    import types

    import torch

    from train.loop.target import apply_speed_settings

    calls = []
    layers = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
    target = types.SimpleNamespace(
        config=types.SimpleNamespace(_attn_implementation="sdpa"), layers=layers
    )

    def set_impl(name):
        calls.append(name)
        target.config._attn_implementation = name

    target.set_attn_implementation = set_impl
    draft = types.SimpleNamespace(train_attention="flex", layers=[])
    gpu = torch.device("cuda")
    apply_speed_settings({}, draft, target, torch.device("cpu"))
    assert draft.train_attention == "sdpa" and calls == []
    apply_speed_settings(
        {"draft_attention": "flex", "target_attention": "flex"}, draft, target, gpu
    )
    assert draft.train_attention == "flex" and calls == ["flex_attention"]
    assert all(layer._compiled_call_impl is None for layer in layers)
    apply_speed_settings({}, draft, target, gpu)
    assert draft.train_attention == "sdpa" and calls == ["flex_attention", "sdpa"]
    # trainer.compile_target compiles every target layer; a later default call undoes it.
    apply_speed_settings({"compile_target": True}, draft, target, gpu)
    assert all(layer._compiled_call_impl is not None for layer in layers)
    apply_speed_settings({}, draft, target, gpu)
    assert all(layer._compiled_call_impl is None for layer in layers)


def test_bad_data_stops_with_row_index(target, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}]})
        + "\n"
        + json.dumps({"messages": "oops"})
        + "\n"
    )
    assert main(fast(target, tmp_path / "o", f"data.train={bad}")) == 2
    err = capsys.readouterr().err
    assert "row" in err.lower()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(fast(target, tmp_path / "o2", f"data.train={empty}")) == 2


def test_unwritable_output_dir(target, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(fast(target, blocker / "sub")) == 2
    assert "not writable" in capsys.readouterr().err


def test_end_to_end_exports_a_valid_vllm_checkpoint(target, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(fast(target, out, "draft.draft_vocab_size=40", "trainer.print_every=2")) == 0
    # With the progress bar off, plain lines at step 1 and every 2 steps say how far a run got.
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[distill] step ")]
    assert [x.split()[2] for x in lines] == ["1/4", "2/4", "4/4"]
    assert check_checkpoint(out / "final") == []
    assert check_checkpoint(out / "final-speculators") == []
    cfg = json.loads((out / "final" / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 40 and cfg["architectures"] == ["Qwen3DSparkModel"]
    prov = json.loads((out / "final" / "provenance.json").read_text())
    assert prov["vocab_counts_hash"] and prov["resolved_config"]["trainer"]["max_steps"] == 4
    assert (out / "final" / "README.md").exists()
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert all(len(r["acceptance_per_pos"]) == 7 for r in train)
    # A second fresh run into the same folder must be explicit.
    assert main(fast(target, out)) == 2


def test_time_budget_stops_early_and_still_exports(target, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    slow_steps(monkeypatch, 0.2)
    args = ("trainer.max_steps=50", "trainer.max_seconds=0.3")
    assert main(fast(target, out, *args)) == 0
    step = json.loads((out / "summary.json").read_text())["step"]
    assert step in (1, 2)  # each step takes at least its 0.2 s delay
    assert f"trainer.max_seconds=0.3 reached after step {step} of 50" in capsys.readouterr().out
    assert check_checkpoint(out / "final") == []


def test_incompatible_resume_is_refused_before_anything_changes(target, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(fast(target, out, "trainer.save_every=2")) == 0
    before = (out / "metrics.jsonl").read_text()
    assert main(fast(target, out, "resume=true", "draft.markov_rank=4")) == 2
    assert "markov_rank" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == before


def _train_losses(out: Path) -> list[tuple[int, float]]:
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in recs if r["split"] == "train"]


def test_killed_run_resumes_exactly(target, tmp_path):
    """SIGKILL a run after its step-4 checkpoint, resume, and compare with an uninterrupted run."""
    steps = ["trainer.max_steps=8", "trainer.save_every=2", "trainer.eval_every=0"]
    ref = tmp_path / "ref"
    assert main(fast(target, ref, *steps)) == 0

    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "tests.slow_steps",  # each step followed by a 1 s pause, so the kill lands mid-run
        "1.0",
        *fast(target, out, *steps),
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.time() + 240
        while not (out / "checkpoints" / "step-000004").exists():
            assert proc.poll() is None, "run ended before it could be killed"
            assert time.time() < deadline, "no step-4 checkpoint in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert not (out / "final").exists()
    killed_at = max(s for s, _ in _train_losses(out))
    assert 4 <= killed_at < 8
    assert main(fast(target, out, *steps, "resume=true")) == 0
    assert _train_losses(out) == _train_losses(ref)


def test_regeneration_step_trains_on_the_targets_own_answers(target, tmp_path):
    out = tmp_path / "regen"
    extra = [
        "data.regenerate.enabled=true",
        "data.regenerate.backend=hf",
        "data.regenerate.max_new_tokens=12",
        "data.regenerate.temperature=0",
        "data.max_rows=6",
        "trainer.max_steps=1",
    ]
    assert main(fast(target, out, *extra)) == 0
    rows = [json.loads(x) for x in (out / "regenerated.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    assert all(r["messages"][-1]["role"] == "assistant" for r in rows)
    before = (out / "regenerated.jsonl").read_text()
    # Resumable: a second run reuses what is there instead of regenerating it.
    assert main(fast(target, out, *extra, "overwrite=true")) == 0
    assert (out / "regenerated.jsonl").read_text() == before


def test_dflash_ablation_trains_and_exports(target, tmp_path):
    out = tmp_path / "dflash"
    assert (
        main(
            fast(
                target,
                out,
                "draft=dflash",
                "draft.markov_rank=0",
                "draft.enable_confidence_head=false",
                "draft.confidence_head_with_markov=false",
            )
        )
        == 0
    )
    cfg = json.loads((out / "final" / "config.json").read_text())
    assert cfg["markov_rank"] == 0 and cfg["enable_confidence_head"] is False
    assert check_checkpoint(out / "final") == []


@pytest.mark.parametrize("mode", ["offline", "disabled"])
def test_wandb_offline_and_disabled_work(target, tmp_path, monkeypatch, mode):
    monkeypatch.setenv("WANDB_MODE", mode)
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / mode
    assert main(fast(target, out, "logger=wandb", "trainer.max_steps=2")) == 0
    assert (out / "wandb_run_id").exists() and (out / "final" / "config.json").exists()
    if mode == "offline":
        assert list((out / "wandb").glob("offline-run-*")), "no offline wandb run written"


@pytest.mark.parametrize("heldout", ["auto", "null"])
def test_dry_run_exports_the_starting_draft_and_trains_nothing(target, tmp_path, capsys, heldout):
    """dry_run=true: the untrained draft goes through the real export to OUTPUT/dry_run/final,
    clean for the contract and the target; no checkpoint, no OUTPUT/final. With held-out rows its
    step-0 acceptance is the one the evaluation measures (the untrained run's eval at step 0)."""
    out = tmp_path / "dry"
    assert main(fast(target, out, "dry_run=true", f"data.heldout={heldout}")) == 0
    final = out / "dry_run" / "final"
    assert check_checkpoint(final) == []
    assert checkpoint_fit_problems(final, target) == []
    assert not (out / "final").exists() and not (out / "checkpoints").exists()
    said = capsys.readouterr().out
    assert "dry run: the draft at step 0" in said and f"serve.check {final}" in said
    assert "| steps | 0 |" in (final / "README.md").read_text()
    if heldout == "auto":
        ref = tmp_path / "ref"
        assert main(fast(target, ref, "trainer.max_steps=1")) == 0
        recs = [json.loads(x) for x in (ref / "metrics.jsonl").read_text().splitlines()]
        step0 = next(r for r in recs if r["split"] == "eval" and r["step"] == 0)
        expected = json.loads((final / PROVENANCE_NAME).read_text())
        assert expected["expected_acceptance"]["per_position"] == step0["acceptance_per_pos"]
