"""serve.launch / serve.vllm_args without vLLM or a GPU: the config surface, every decision, the
`vllm serve` argv, and both branches end to end with the machine probes and exec patched."""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
import types
from pathlib import Path

import pytest

from common.checkpoint import save_checkpoint
from common.config import DSparkConfig
from common.model import DSparkDraftModel
from serve import launch
from serve.launch import (
    ServeCfg,
    check_paths,
    choose_engine,
    compose_serve_config,
    drop_missing_features,
)
from serve.vllm_args import (
    LaunchRefused,
    ShardingInputs,
    VllmServeArgs,
    batch_sharded_blockers,
    build_vllm_command,
    check_draft_tp,
    check_extra_args,
    check_markov_head,
    check_speculative_config,
    decide_adaptive_verification,
    decide_batch_sharded_sampling,
    format_sampling_plan,
    pynccl_disabled,
    resolve_num_speculative_tokens,
    sequential_sampling_reasons,
    speculative_config,
    target_has_compute_logits_local,
    vllm_missing_features,
    vllm_version_ok,
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
    """Patch the probes and exec; returns a dict to set vllm/gpus and read what was exec'd."""
    state = {"vllm": None, "gpus": 0, "exec": None}
    monkeypatch.setattr(launch, "probe_vllm_version", lambda: state["vllm"])
    monkeypatch.setattr(launch, "probe_cuda_devices", lambda: state["gpus"])
    monkeypatch.setattr(launch, "exec_command", lambda cmd: state.__setitem__("exec", cmd))
    monkeypatch.setattr(launch.shutil, "which", lambda name: "/usr/bin/" + name)
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
        "sps_table",
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
    assert "python -m train.distill +experiment=tiny" in err
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
        ("0.24.1", 1, 1, "vanilla", "embedded", "vllm>=0.25,<0.35"),
        ("0.26.0", 1, 1, "vanilla", "vllm", "0.26.0"),
        ("0.35.0", 1, 1, "vanilla", "embedded", "vllm>=0.25,<0.35"),
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


def test_vllm_version_pin():
    assert vllm_version_ok("0.34.0") and vllm_version_ok("0.34.2rc1")
    assert not any(vllm_version_ok(v) for v in (None, "", "unknown", "0.33.9", "0.35.0", "1.34"))


def test_older_vllm_runs_without_the_features_it_lacks():
    assert vllm_missing_features("0.34.0") == []
    assert vllm_missing_features("0.33.2") == ["batch_sharded_sampling"]
    assert vllm_missing_features("0.26.0") == ["adaptive_verification", "batch_sharded_sampling"]
    assert "dspark" in vllm_missing_features("0.24.0") and "dspark" in vllm_missing_features(None)
    assert drop_missing_features("0.34.1", True, True)[:2] == (True, True)
    adaptive, sharded, notes = drop_missing_features("0.26.0", True, True)
    assert (adaptive, sharded) == (False, False)
    assert "adaptive_verification, batch_sharded_sampling" in notes[0]
    assert drop_missing_features("0.33.0", True, False)[:2] == (True, False)
    assert drop_missing_features(None, True, True)[:2] == (True, True)  # dry run without vLLM


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
    with pytest.raises(LaunchRefused, match="LoRA"):
        decide_adaptive_verification(True, with_head, extra_args=["--enable-lora"])
    with pytest.raises(LaunchRefused, match="pipeline"):
        decide_adaptive_verification(True, with_head, extra_args=["-pp", "2"])
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
    assert "return_sampling_mask" in batch_sharded_blockers(2, 8, 5, ["--return-sampling-mask"])[0]


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
        build_vllm_command(VllmServeArgs(target="t", checkpoint="", num_speculative_tokens=3))


def test_extra_args_cannot_shadow_managed_flags():
    check_extra_args(["--gpu-memory-utilization", "0.9"])
    for flag in ("-tp", "--speculative-config={}", "--enable-batch-sharded-sampling", "--port"):
        with pytest.raises(LaunchRefused, match="launcher key"):
            check_extra_args([flag, "1"])


# ---------------------------------------------------------------- the six reasons


def sharding(**kw) -> ShardingInputs:
    base = dict(
        tensor_parallel_size=2,
        batch_sharded_sampling=True,
        draft_sample_method="probabilistic",
        enable_adaptive_verification=False,
        has_confidence_head=True,
        dspark_draft_topk=None,
        target_has_compute_logits_local=True,
    )
    return ShardingInputs(**{**base, **kw})


@pytest.mark.parametrize(
    "kw, first",
    [
        ({}, None),
        ({"draft_sample_method": "greedy"}, None),
        ({"enable_adaptive_verification": True}, None),  # confidence head: no estimator
        ({"prefill_context_parallel_size": 2}, 1),
        ({"watermarking": True}, 1),
        ({"enable_adaptive_verification": True, "has_confidence_head": False}, 2),
        ({"dspark_draft_topk": 8}, 3),
        ({"draft_fuses_sample_sequential": True, "draft_sample_method": "greedy"}, 4),
        ({"draft_fuses_sample_sequential": True}, 1),  # no row mapping then, and 1 comes first
        ({"draft_has_compute_draft_logits_local": False}, 5),
        ({"draft_tensor_parallel_size": 1}, 5),
        ({"pynccl_disabled": True}, 6),
        ({"dspark_draft_topk": 8, "pynccl_disabled": True, "watermarking": True}, 1),
    ],
)
def test_sequential_sampling_first_reason(kw, first):
    plan = sequential_sampling_reasons(sharding(**kw))
    assert [r.index for r in plan.reasons] == [1, 2, 3, 4, 5, 6]
    assert plan.attempted is True
    got = plan.first_reason
    assert (got.index if got else None) == first
    assert plan.sharded is (first is None)
    lines = format_sampling_plan(plan)
    if first is None:
        assert "batch-sharded across TP ranks" in lines[-1]
    else:
        assert plan.reasons[first - 1].log in lines[-1]


def test_reason_texts_are_vllms():
    logs = [r.log for r in sequential_sampling_reasons(sharding()).reasons]
    assert logs == [
        "the draft logits cache is replicated",
        "the online acceptance estimator fits on every request's draft logits on every rank",
        "top-k Markov sampling is not supported",
        "the draft model fuses its own sequential sampling",
        "the draft model cannot compute vocab-sharded draft logits",
        "PyNCCL is unavailable",
    ]


def test_sequential_sampling_not_attempted():
    for kw, gate in [
        ({"tensor_parallel_size": 1}, "tp=1"),
        ({"batch_sharded_sampling": False}, "batch-sharded sampling is off"),
        ({"target_has_compute_logits_local": False}, "compute_logits_local"),
    ]:
        plan = sequential_sampling_reasons(sharding(**kw))
        assert plan.attempted is False and plan.sharded is False and gate in plan.gate
        assert len(format_sampling_plan(plan)) == 1
    unknown = sequential_sampling_reasons(sharding(target_has_compute_logits_local=None))
    assert unknown.attempted is None and unknown.sharded is None and unknown.reasons


def test_environment_and_target_probes():
    assert pynccl_disabled({"VLLM_DISABLE_PYNCCL": "1"}) and pynccl_disabled(
        {"VLLM_DISABLE_PYNCCL": "True"}
    )
    assert not pynccl_disabled({}) and not pynccl_disabled({"VLLM_DISABLE_PYNCCL": "0"})
    assert target_has_compute_logits_local(["Qwen3ForCausalLM"]) is True
    assert target_has_compute_logits_local(["FancyForCausalLM"]) is None
    assert target_has_compute_logits_local(None) is None


# ---------------------------------------------------------------- argv builder


def test_build_vllm_command_exact():
    args = VllmServeArgs(
        target="Qwen/Qwen3-8B",
        checkpoint="/ckpt",
        num_speculative_tokens=6,
        draft_sample_method="probabilistic",
        enable_adaptive_verification=True,
        attention_backend="FLASH_ATTN",
        tensor_parallel_size=2,
        enable_batch_sharded_sampling=True,
        host="0.0.0.0",
        port=8001,
        max_num_seqs=64,
        extra_args=("--gpu-memory-utilization", "0.8"),
    )
    cmd = build_vllm_command(args)
    assert cmd[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {
        "method": "dspark",
        "model": "/ckpt",
        "num_speculative_tokens": 6,
        "draft_sample_method": "probabilistic",
        "enable_adaptive_verification": True,
        "attention_backend": "FLASH_ATTN",
    }
    assert cmd[5:] == [
        "-tp",
        "2",
        "--enable-batch-sharded-sampling",
        "--host",
        "0.0.0.0",
        "--port",
        "8001",
        "--max-num-seqs",
        "64",
        "--gpu-memory-utilization",
        "0.8",
    ]


def test_build_vllm_command_minimal_and_baseline():
    cmd = build_vllm_command(
        VllmServeArgs(
            target="t",
            checkpoint="c",
            num_speculative_tokens=3,
            draft_sample_method="greedy",
            enforce_eager=True,
        )
    )
    spec = json.loads(cmd[4])
    assert "enable_adaptive_verification" not in spec and spec["draft_sample_method"] == "greedy"
    assert "--enable-batch-sharded-sampling" not in cmd and cmd[-1] == "--enforce-eager"
    baseline = build_vllm_command(VllmServeArgs(target="t", checkpoint=None))
    assert baseline == ["vllm", "serve", "t", "-tp", "1"]
    assert speculative_config(VllmServeArgs(target="t", checkpoint=None)) is None


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
    assert "batch-sharded across TP ranks" in out
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
    assert "vllm>=0.34,<0.35" in capsys.readouterr().err
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
    )
    assert (calls["host"], calls["port"], calls["name"]) == ("127.0.0.1", 9001, "tiny")
    out = capsys.readouterr().out
    assert "no confidence head" in out and "ignores vLLM-only settings: tensor_parallel_size" in out


def test_serve_never_imports_train():
    """STYLE.md: a server must not pull in the trainer (static, so lazy imports count too)."""
    root = Path(launch.__file__).resolve().parents[1]
    bad = []
    for path in sorted((root / "serve").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            bad += [f"{path.name}: {n}" for n in names if n == "train" or n.startswith("train.")]
    assert not bad


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
