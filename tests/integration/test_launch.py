"""serve.launch (+ launch_config, launch_vllm, launch_embedded) / serve.vllm_args without vLLM or
a GPU: the config surface, every decision, the `vllm serve` argv, both branches end to end with
the machine probes and exec patched, the one validation per launch, and bad input as one line."""

from __future__ import annotations

import dataclasses
import json
import sys
import types

import pytest

from common.checkpoint import save_checkpoint
from common.config import DSparkConfig
from common.model import DSparkDraftModel
from serve import launch
from serve.launch import choose_engine
from serve.launch_config import (
    LaunchRefused,
    ServeCfg,
    check_paths,
    compose_serve_config,
    decide_adaptive_verification,
    resolve_num_speculative_tokens,
)
from serve.vllm_args import (
    build_vllm_command,
    check_draft_tp,
    check_extra_args,
    check_markov_head,
    check_speculative_config,
    decide_batch_sharded_sampling,
)
from tests.conftest import tiny_config as conftest_tiny_config

# ---------------------------------------------------------------- fixtures


# A tiny draft (V=96, H=32, B=4, r=8, one layer); only its config and tensor names/shapes matter.
def tiny_config(**overrides) -> DSparkConfig:
    return conftest_tiny_config(**{"num_hidden_layers": 1, **overrides})


def tiny_model(**overrides) -> DSparkDraftModel:
    return DSparkDraftModel(tiny_config(**overrides))


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A fake local target folder and three tiny drafts: anchor-first with a confidence head,
    1+N without one, and a gated Markov head."""
    root = tmp_path_factory.mktemp("serve")
    target = root / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    ckpts = {
        "anchor": tiny_model(),
        "onen": tiny_model(sample_from_anchor=False, enable_confidence_head=False),
        "gated": tiny_model(markov_head_type="gated"),
    }
    paths = {"target": str(target)}
    for name, model in ckpts.items():
        paths[name] = str(save_checkpoint(model, root / name))
    return paths


@pytest.fixture
def machine(monkeypatch):
    """Patch the probes, the port check and exec; returns a dict to set vllm/gpus and read what
    was exec'd and which ports were checked."""
    state = {"vllm": None, "gpus": 0, "exec": None, "ports": []}
    monkeypatch.setattr(launch, "check_port_free", lambda h, p: state["ports"].append((h, p)))
    monkeypatch.setattr(launch, "probe_vllm_version", lambda: state["vllm"])
    monkeypatch.setattr(launch, "probe_cuda_devices", lambda: state["gpus"])
    monkeypatch.setattr(launch, "exec_command", lambda cmd: state.__setitem__("exec", cmd))
    monkeypatch.setattr(launch, "which", lambda name: "/usr/bin/" + name)
    return state


def run(assets, *overrides, ckpt="anchor"):
    return launch.main([f"target={assets['target']}", f"checkpoint={assets[ckpt]}", *overrides])


# ---------------------------------------------------------------- config surface


def test_cli_surface_is_frozen():
    """The public keys of `python -m serve.launch` (a rename breaks users' commands)."""
    assert [f.name for f in dataclasses.fields(ServeCfg)] == [
        "target",
        "checkpoint",
        "engine",
        "host",
        "port",
        "served_model_name",
        "num_speculative_tokens",
        "draft_sampling",
        "adaptive_verification",
        "tensor_parallel_size",
        "draft_tensor_parallel_size",
        "batch_sharded_sampling",
        "max_num_seqs",
        "max_model_len",
        "max_logprobs",
        "enforce_eager",
        "attention_backend",
        "dtype",
        "seed",
        "extra_vllm_args",
        "device",
        "adaptive_policy",
        "adaptive_budget_confidence",
        "cost_table",
        "sps_table",
        "use_fp64_gumbel",
        "dry_run",
    ]


def test_yaml_defaults_match_schema():
    assert compose_serve_config([]) == ServeCfg()
    cfg = compose_serve_config(
        [
            "target=/x",
            "checkpoint=null",
            "tensor_parallel_size=4",
            "batch_sharded_sampling=true",
            "extra_vllm_args=[--gpu-memory-utilization,0.85]",
            "engine=vllm",
        ]
    )
    assert cfg.checkpoint is None and cfg.tensor_parallel_size == 4
    assert cfg.batch_sharded_sampling is True
    assert cfg.extra_vllm_args == ["--gpu-memory-utilization", "0.85"]


@pytest.mark.parametrize(
    "override, key",
    [
        ("foo=1", "foo"),
        ("port=abc", "port"),
        ("engine=tpu", "engine"),
        ("draft_sampling=topk", "draft_sampling"),
        ("batch_sharded_sampling=maybe", "batch_sharded_sampling"),
        ("tensor_parallel_size=0", "tensor_parallel_size"),
        ("num_speculative_tokens=0", "num_speculative_tokens"),
        ("+port=1", "port"),
        ("checkpoint.path=x", "checkpoint.path"),
    ],
)
def test_bad_override_exits_2_and_names_key(override, key, capsys):
    assert launch.main([override]) == 2
    assert key in capsys.readouterr().err


def test_missing_defaults_name_the_training_command(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert launch.main([]) == 2
    err = capsys.readouterr().err
    assert "bash scripts/quickstart.sh" in err
    assert "artifacts/tiny-target" in err and "outputs/tiny/final" in err


def test_check_paths(assets, tmp_path):
    assert check_paths(ServeCfg(target=assets["target"], checkpoint=assets["anchor"])) == []
    notes = check_paths(ServeCfg(target="Qwen/Qwen3-8B", checkpoint=assets["anchor"]))
    assert "Hugging Face" in notes[0]
    with pytest.raises(LaunchRefused, match="checkpoint="):
        check_paths(ServeCfg(target=assets["target"], checkpoint=str(tmp_path / "none")))
    with pytest.raises(LaunchRefused, match="target="):
        check_paths(ServeCfg(target="./nope", checkpoint=assets["anchor"]))


def test_help(capsys):
    assert launch.main(["--help"]) == 0
    assert "dry_run" in capsys.readouterr().out


# ---------------------------------------------------------------- engine choice


@pytest.mark.parametrize(
    "version, gpus, tp, head, engine, why",
    [
        (None, 1, 1, "vanilla", "embedded", "not installed"),
        ("0.25.2", 1, 1, "vanilla", "embedded", "vllm>=0.26,<0.35"),
        ("0.35.0", 1, 1, "vanilla", "embedded", "vllm>=0.26,<0.35"),
        ("0.26.0", 1, 1, "vanilla", "vllm", "0.26.0"),
        ("0.34.0", 0, 1, "vanilla", "embedded", "no CUDA GPU"),
        ("0.34.0", 1, 2, "vanilla", "embedded", "needs 2 GPUs"),
        ("0.34.0", 8, 2, "gated", "embedded", "only vanilla"),
        ("0.34.0", 1, 1, "vanilla", "vllm", "0.34.0"),
        ("0.34.1.dev5+gabc", 2, 2, None, "vllm", "2 CUDA GPU"),
    ],
)
def test_choose_engine_auto(version, gpus, tp, head, engine, why):
    got, reason = choose_engine(
        "auto", vllm_version=version, num_gpus=gpus, tensor_parallel_size=tp, markov_head_type=head
    )
    assert got == engine and why in reason


def test_choose_engine_explicit():
    assert choose_engine("vllm", vllm_version=None, num_gpus=0)[0] == "vllm"
    assert choose_engine("embedded", vllm_version="0.34.0", num_gpus=8)[0] == "embedded"


# ---------------------------------------------------------------- decisions


def test_num_speculative_tokens_from_layout():
    assert resolve_num_speculative_tokens(None, tiny_config())[0] == 4  # anchor-first: B
    assert resolve_num_speculative_tokens(None, tiny_config(sample_from_anchor=False))[0] == 3
    n, notes = resolve_num_speculative_tokens(2, tiny_config())
    assert n == 2 and any("warning" in m for m in notes)
    with pytest.raises(LaunchRefused, match="at most 3"):
        resolve_num_speculative_tokens(4, tiny_config(sample_from_anchor=False))


def test_adaptive_verification_decision():
    with_head = tiny_config()
    assert decide_adaptive_verification(True, with_head)[0] is True
    assert decide_adaptive_verification(False, with_head)[0] is False
    on, notes = decide_adaptive_verification(True, tiny_config(enable_confidence_head=False))
    assert on is False and "no confidence head" in notes[0] and notes[0].startswith("warning")
    with pytest.raises(LaunchRefused, match="full CUDA graphs"):
        decide_adaptive_verification(True, with_head, enforce_eager=True)
    # A vLLM without adaptive verification gets the key dropped later, so eager is no refusal.
    assert decide_adaptive_verification(True, with_head, enforce_eager=True, vllm_version="0.26.0")[
        0
    ]
    # Eager mode is fine when adaptive verification is dropped for want of a confidence head.
    assert not decide_adaptive_verification(
        True, tiny_config(enable_confidence_head=False), enforce_eager=True
    )[0]


def test_batch_sharded_sampling_preconditions():
    assert decide_batch_sharded_sampling("auto", 2, None, None)[0] is True
    assert decide_batch_sharded_sampling("auto", 4, 4, 0)[0] is True
    assert decide_batch_sharded_sampling(False, 4, None, None)[0] is False
    for args, blocker in [
        ((1, None, None), "tensor_parallel_size is 1"),
        ((4, 2, None), "max_num_seqs (2) is below tensor_parallel_size (4)"),
        ((2, None, -1), "max_logprobs is -1"),
    ]:
        on, notes = decide_batch_sharded_sampling("auto", *args)
        assert on is False and blocker in notes[0]
        with pytest.raises(LaunchRefused, match=blocker.replace("(", r"\(").replace(")", r"\)")):
            decide_batch_sharded_sampling(True, *args)
    # vLLM 0.29-0.33 refuse batch-sharded sampling with adaptive verification; 0.34 takes both.
    assert decide_batch_sharded_sampling("auto", 2, None, None, "0.34.0", True)[0] is True
    on, notes = decide_batch_sharded_sampling("auto", 2, None, None, "0.32.0", True)
    assert on is False and "adaptive verification is on" in notes[0]
    with pytest.raises(LaunchRefused, match="adaptive verification is on"):
        decide_batch_sharded_sampling(True, 2, None, None, "0.32.0", True)
    for requested in ("auto", True):  # an old vLLM runs without the flag instead of failing
        on, notes = decide_batch_sharded_sampling(requested, 4, None, None, "0.26.0")
        assert on is False and "vLLM 0.26.0 has no such flag" in notes[0]


def test_markov_head_and_draft_tp_refusals():
    check_markov_head(tiny_config())
    for head in ("gated", "rnn"):
        with pytest.raises(LaunchRefused, match="engine=embedded"):
            check_markov_head(tiny_config(markov_head_type=head))
    check_draft_tp(2, None)
    check_draft_tp(2, 2)
    for draft_tp in (1, 4):
        with pytest.raises(LaunchRefused, match="draft_tensor_parallel_size"):
            check_draft_tp(2, draft_tp)


def test_speculative_config_must_name_the_model():
    good = {"method": "dspark", "model": "/ckpt", "num_speculative_tokens": 7}
    check_speculative_config(good)
    with pytest.raises(LaunchRefused, match='no "model"'):
        check_speculative_config({k: v for k, v in good.items() if k != "model"})
    with pytest.raises(LaunchRefused, match="num_speculative_tokens"):
        check_speculative_config({**good, "num_speculative_tokens": None})
    with pytest.raises(LaunchRefused, match="method"):
        check_speculative_config({**good, "method": "dflash"})
    with pytest.raises(LaunchRefused, match='no "model"'):
        build_vllm_command(ServeCfg(target="t"), {**good, "model": ""})


def test_extra_args_cannot_shadow_managed_flags():
    check_extra_args(["--gpu-memory-utilization", "0.9"])
    for flag in ("-tp", "--speculative-config={}", "--enable-batch-sharded-sampling", "--port"):
        with pytest.raises(LaunchRefused, match="launcher key"):
            check_extra_args([flag, "1"])


# ---------------------------------------------------------------- argv builder


def test_build_vllm_command_exact():
    cfg = ServeCfg(
        target="Qwen/Qwen3-8B",
        checkpoint="/ckpt",
        tensor_parallel_size=2,
        host="0.0.0.0",
        port=8001,
        max_num_seqs=64,
        extra_vllm_args=["--gpu-memory-utilization", "0.8"],
    )
    spec = {"method": "dspark", "model": "/ckpt", "num_speculative_tokens": 6}
    cmd = build_vllm_command(cfg, spec, batch_sharded=True)
    assert cmd == [
        "vllm",
        "serve",
        "Qwen/Qwen3-8B",
        "--speculative-config",
        '{"method":"dspark","model":"/ckpt","num_speculative_tokens":6}',
        "-tp",
        "2",
        "--host",
        "0.0.0.0",
        "--port",
        "8001",
        "--max-num-seqs",
        "64",
        "--enable-batch-sharded-sampling",
        "--gpu-memory-utilization",
        "0.8",
    ]


def test_build_vllm_command_minimal_and_baseline():
    cfg = ServeCfg(target="t", enforce_eager=True, seed=3)
    cmd = build_vllm_command(cfg, {"method": "dspark", "model": "c", "num_speculative_tokens": 3})
    assert "--enable-batch-sharded-sampling" not in cmd and cmd[-1] == "--enforce-eager"
    assert cmd[cmd.index("--seed") + 1] == "3"
    baseline = build_vllm_command(ServeCfg(target="t"), None)
    assert baseline == ["vllm", "serve", "t", "-tp", "1", "--host", "127.0.0.1", "--port", "8000"]


# ---------------------------------------------------------------- end to end (patched machine)


def test_vllm_dry_run_prints_decisions(assets, machine, capsys):
    assert (
        run(
            assets,
            "engine=vllm",
            "dry_run=true",
            "tensor_parallel_size=2",
            "adaptive_verification=true",
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "num_speculative_tokens=4 (block_size=4, anchor-first layout)" in out
    assert "adaptive verification: on" in out
    assert "vLLM is not installed: the command is written for vLLM 0.34" in out
    assert "vLLM decides at load whether to batch-shard it" in out
    cmd_line = next(ln for ln in out.splitlines() if "command: " in ln)
    assert "vllm serve " + assets["target"] in cmd_line
    assert '"model":"' + assets["anchor"] in cmd_line
    assert "--enable-batch-sharded-sampling" in cmd_line
    assert machine["exec"] is None


def test_vllm_execs_when_installed(assets, machine, capsys):
    machine.update(vllm="0.34.0", gpus=1)
    assert run(assets, ckpt="onen") == 0
    cmd = machine["exec"]
    assert cmd[:3] == ["vllm", "serve", assets["target"]]
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == 3 and spec["model"] == assets["onen"]
    assert "engine: vllm (vLLM 0.34.0 and 1 CUDA GPU(s))" in capsys.readouterr().out


def test_vllm_refusals_end_to_end(assets, machine, capsys, tmp_path):
    assert run(assets, "engine=vllm", "dry_run=true", ckpt="gated") == 2
    assert "engine=embedded" in capsys.readouterr().err
    assert run(assets, "engine=vllm", "adaptive_verification=true", "enforce_eager=true") == 2
    assert "full CUDA graphs" in capsys.readouterr().err
    assert run(assets, "engine=vllm", "tensor_parallel_size=2", "draft_tensor_parallel_size=1") == 2
    assert "draft_tensor_parallel_size" in capsys.readouterr().err
    assert (
        run(
            assets,
            "engine=vllm",
            "tensor_parallel_size=4",
            "max_num_seqs=2",
            "batch_sharded_sampling=true",
        )
        == 2
    )
    assert "max_num_seqs (2)" in capsys.readouterr().err
    # Not dry: vLLM missing.
    assert run(assets, "engine=vllm") == 2
    assert "vllm>=0.26,<0.35" in capsys.readouterr().err
    # A checkpoint failing the contract (a layout key removed).
    bad = tmp_path / "bad"
    save_checkpoint(tiny_model(), bad)
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["dspark_bonus_anchor"]
    (bad / "config.json").write_text(json.dumps(cfg))
    assert (
        launch.main(
            [f"target={assets['target']}", f"checkpoint={bad}", "engine=vllm", "dry_run=true"]
        )
        == 2
    )
    assert "dspark_bonus_anchor" in capsys.readouterr().err
    assert machine["exec"] is None


def test_auto_falls_back_and_says_why(assets, machine, capsys):
    machine.update(vllm="0.34.0", gpus=2)
    assert run(assets, "dry_run=true", ckpt="gated") == 0
    out = capsys.readouterr().out
    assert "engine: embedded (markov_head_type='gated'" in out
    machine.update(vllm=None)
    assert run(assets, "dry_run=true") == 0
    assert "engine: embedded (vLLM is not installed)" in capsys.readouterr().out


def test_embedded_branch_builds_engine_options(assets, machine, monkeypatch, capsys):
    """The real EngineOptions is built; only the (blocking) server is stubbed."""
    from serve.engine.options import EngineOptions

    calls = {}

    def run_server(opts, host, port, served_model_name=None):
        calls.update(opts=opts, host=host, port=port, name=served_model_name)

    monkeypatch.setitem(
        sys.modules, "serve.api.server", types.SimpleNamespace(run_server=run_server)
    )
    rc = run(
        assets,
        "engine=embedded",
        "adaptive_verification=true",
        "draft_sampling=greedy",
        "max_num_seqs=4",
        "port=9001",
        "served_model_name=tiny",
        "tensor_parallel_size=2",
        "use_fp64_gumbel=true",
        "enforce_eager=true",
        ckpt="onen",
    )
    assert rc == 0
    opts = calls["opts"]
    assert opts == EngineOptions(
        target=assets["target"],
        checkpoint=assets["onen"],
        device="cpu",
        num_speculative_tokens=3,
        draft_sampling="greedy",
        adaptive_verification=False,
        max_num_seqs=4,
        tp=2,
        use_fp64_gumbel=True,
        checkpoint_checked=True,
    )
    assert (calls["host"], calls["port"], calls["name"]) == ("127.0.0.1", 9001, "tiny")
    out = capsys.readouterr().out
    assert "no confidence head" in out and "ignores vLLM-only settings: enforce_eager" in out


def test_embedded_tp_without_a_world_exits_2(assets, machine, monkeypatch, capsys):
    """tensor_parallel_size=2 on the embedded engine needs torchrun's ranks: refused before any
    model is loaded (the real run_server)."""
    from serve.engine.lockstep import TORCHRUN_ENV

    for key in TORCHRUN_ENV:
        monkeypatch.delenv(key, raising=False)
    assert run(assets, "engine=embedded", "tensor_parallel_size=2") == 2
    assert "torchrun --nproc-per-node 2" in capsys.readouterr().err


def test_embedded_branch_passes_the_adaptive_policy_and_refuses_a_mismatched_table(
    assets, machine, monkeypatch, capsys
):
    """adaptive_policy / cost_table / sps_table reach EngineOptions as given; an SPS table under
    vLLM's policy is refused (exit 2) by EngineOptions' own check, before any model loads."""
    calls = {}
    monkeypatch.setitem(
        sys.modules,
        "serve.api.server",
        types.SimpleNamespace(run_server=lambda opts, *a, **kw: calls.update(opts=opts)),
    )
    rc = run(assets, "engine=embedded", "adaptive_policy=algorithm1", "sps_table=s.json")
    assert rc == 0
    assert (calls["opts"].adaptive_policy, calls["opts"].sps_table) == ("algorithm1", "s.json")
    assert run(assets, "engine=embedded", "cost_table=c.json") == 0
    assert (calls["opts"].adaptive_policy, calls["opts"].cost_table) == ("vllm", "c.json")
    calls.clear()
    assert run(assets, "engine=embedded", "sps_table=s.json") == 2
    assert not calls and "adaptive_policy='algorithm1'" in capsys.readouterr().err


def test_embedded_branch_passes_the_budget_confidence(assets, machine, monkeypatch, capsys):
    """adaptive_budget_confidence reaches EngineOptions; under algorithm1 (no budget) it is
    refused (exit 2) by EngineOptions' own check, before any model loads."""
    calls = {}
    monkeypatch.setitem(
        sys.modules,
        "serve.api.server",
        types.SimpleNamespace(run_server=lambda opts, *a, **kw: calls.update(opts=opts)),
    )
    assert run(assets, "engine=embedded") == 0
    assert calls["opts"].adaptive_budget_confidence == "current"
    assert run(assets, "engine=embedded", "adaptive_budget_confidence=previous") == 0
    assert calls["opts"].adaptive_budget_confidence == "previous"
    calls.clear()
    bad = ("engine=embedded", "adaptive_policy=algorithm1", "adaptive_budget_confidence=previous")
    assert run(assets, *bad) == 2
    assert not calls and "adaptive_budget_confidence='previous'" in capsys.readouterr().err
    machine.update(vllm="0.34.0", gpus=1)  # vLLM's own budget: the key is the engine's only
    assert run(assets, "engine=vllm", "dry_run=true", "adaptive_budget_confidence=previous") == 0
    assert "ignores embedded-engine settings: adaptive_budget_confidence" in capsys.readouterr().out


def test_vllm_branch_says_it_ignores_fp64_gumbel(assets, machine, capsys):
    machine.update(vllm="0.34.0", gpus=1)
    assert run(assets, "engine=vllm", "dry_run=true", "use_fp64_gumbel=true") == 0
    out = capsys.readouterr().out
    assert "ignores embedded-engine settings: use_fp64_gumbel" in out
    assert "fp64" not in out.split("command: ")[1]


def test_baseline_without_checkpoint(assets, machine, capsys):
    rc = launch.main(
        [
            f"target={assets['target']}",
            "checkpoint=null",
            "engine=vllm",
            "dry_run=true",
            "adaptive_verification=true",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "serving the target alone" in out and "--speculative-config" not in out


@pytest.mark.parametrize(
    "extra, expected",
    [
        ([], ["--per-request-spec-decode-metrics", "summary"]),
        (
            ["--per-request-spec-decode-metrics=detailed"],
            ["--per-request-spec-decode-metrics=detailed"],
        ),
        (
            ["--per-request-spec-decode-metrics", "none"],
            ["--per-request-spec-decode-metrics", "none"],
        ),
    ],
)
def test_responses_carry_their_own_acceptance_unless_the_user_says_otherwise(
    assets, machine, extra, expected
):
    """With a draft on vLLM >= 0.29 each response reports its own acceptance (for serve.bench's
    interval over requests); a user's own setting of the flag is passed alone, never doubled."""
    machine.update(vllm="0.34.0", gpus=1)
    assert run(assets, f"extra_vllm_args=[{','.join(map(repr, extra))}]") == 0
    cmd = machine["exec"]
    flagged = [i for i, a in enumerate(cmd) if a.startswith("--per-request-spec-decode-metrics")]
    assert len(flagged) == 1
    assert cmd[flagged[0] : flagged[0] + len(expected)] == expected
    machine.update(exec=None)
    assert run(assets, "checkpoint=null") == 0  # target alone: vLLM would refuse the flag
    assert not any(a.startswith("--per-request-spec") for a in machine["exec"])


@pytest.mark.parametrize(
    "version, adaptive_kept, sharded_flag",
    [
        ("0.26.0", False, False),
        ("0.28.0", True, False),
        ("0.32.0", True, False),
        ("0.34.0", True, True),
    ],
)
def test_older_vllm_runs_without_missing_features(
    assets, machine, capsys, version, adaptive_kept, sharded_flag
):
    """vLLM 0.26 forbids unknown speculative-config keys and has no batch-sharded flag: the launch
    drops both with a printed line and execs, instead of failing."""
    machine.update(vllm=version, gpus=2)
    assert run(assets, "adaptive_verification=true", "tensor_parallel_size=2") == 0
    cmd = machine["exec"]
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert ("enable_adaptive_verification" in spec) is adaptive_kept
    assert ("--enable-batch-sharded-sampling" in cmd) is sharded_flag
    # each response's own acceptance: from 0.29 on (0.26 and 0.28 would refuse the flag)
    assert ("--per-request-spec-decode-metrics" in cmd) is (version >= "0.29")
    assert spec["draft_sample_method"] == "probabilistic"
    out = capsys.readouterr().out
    lacks = [ln for ln in out.splitlines() if f"vLLM {version} lacks" in ln]
    dropped = "dropped 'enable_adaptive_verification' from the speculative config" in out
    assert dropped is not adaptive_kept
    if version == "0.26.0":
        assert len(lacks) == 6 and any("dspark_bonus_anchor" in ln for ln in lacks)
    elif version == "0.28.0":
        assert len(lacks) == 4 and "batch-sharded sampling" in lacks[0]
    elif version == "0.32.0":
        assert len(lacks) == 2 and "sequential (Markov) sampling" in lacks[1]
    else:
        assert lacks == []
