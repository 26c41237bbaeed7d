"""What `serve.launch` checks before it starts an engine, on the tiny fixtures in-process: the
checkpoint is validated once per launch (the embedded engine told so does not repeat it), every
bad input ends as one stderr line and exit code 2, and a port in use is refused before the
checkpoint is even read."""

from __future__ import annotations

import json
import socket
from collections import Counter

import pytest

import common.contract
import common.target_fit
import serve.engine.loader
from serve import launch
from serve.engine import Engine, EngineOptions
from serve.launch_config import LaunchRefused
from tests.unit.test_engine_helpers import make_draft, make_target, save_draft, save_target


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A real tiny target folder (model + tokenizer) and a draft trained for it."""
    root = tmp_path_factory.mktemp("launch_checks")
    target = make_target(0)
    return save_target(target, root / "target"), save_draft(make_draft(target), root / "draft")


@pytest.fixture
def no_gpu_no_vllm(monkeypatch):
    monkeypatch.setattr(launch, "probe_vllm_version", lambda: None)
    monkeypatch.setattr(launch, "probe_cuda_devices", lambda: 0)
    monkeypatch.setattr(launch, "check_port_free", lambda host, port: None)


def count_calls(monkeypatch, counts: Counter, module, name: str, as_name: str | None = None):
    real = getattr(module, name)

    def counted(*a, **kw):
        counts[as_name or name] += 1
        return real(*a, **kw)

    monkeypatch.setattr(module, name, counted)


def test_the_embedded_launch_validates_the_checkpoint_once(pair, no_gpu_no_vllm, monkeypatch):
    """The launch validates (contract + fit); the engine it starts loads the models without
    comparing draft and target again. Engine.from_options alone compares them once."""
    import uvicorn

    target, draft = pair
    counts = Counter()
    count_calls(monkeypatch, counts, common.contract, "check_checkpoint")
    # Every draft/target comparison ends in fit_problems: the launch's through target_fit, the
    # engine's through the loader's own binding of it.
    count_calls(monkeypatch, counts, common.target_fit, "fit_problems")
    count_calls(monkeypatch, counts, serve.engine.loader, "fit_problems")
    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(kw))
    argv = [f"target={target}", f"checkpoint={draft}", "engine=embedded", "dtype=float64"]
    assert launch.main([*argv, "port=9123"]) == 0
    assert served["port"] == 9123  # the engine was built and handed to the server
    assert counts == {"check_checkpoint": 1, "fit_problems": 1}

    counts.clear()  # without the launch, the loader compares the pair itself, once
    opts = EngineOptions(target=str(target), checkpoint=str(draft), dtype="float64")
    assert Engine.from_options(opts).num_spec == 4
    assert counts == {"fit_problems": 1}


def _truncated(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        data = f.read_bytes()
        (dst / f.name).write_bytes(data[: len(data) // 2] if f.suffix == ".safetensors" else data)
    return dst


def _bad_json(src, dst):
    _truncated(src, dst)
    (dst / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    (dst / "config.json").write_text('{"architectures": ["Qwen3DSparkModel"], ')
    return dst


@pytest.mark.parametrize("engine", ["embedded", "vllm"])
@pytest.mark.parametrize(
    "case, expected",
    [
        ("truncated weights", "is truncated: expected"),
        ("corrupt config", "config.json is not valid JSON"),
        ("missing target", "no such folder"),
        ("hub id that is no folder", "is not a folder"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    pair, no_gpu_no_vllm, tmp_path, capsys, case, expected, engine
):
    target, draft = pair
    if case == "truncated weights":
        draft = _truncated(draft, tmp_path / "trunc")
    elif case == "corrupt config":
        draft = _bad_json(draft, tmp_path / "badjson")
    elif case == "missing target":
        target = tmp_path / "no_target"
    else:  # passed on as a Hub id; the embedded engine needs a folder, vLLM would download it
        if engine == "vllm":
            pytest.skip("vLLM takes a Hub id")
        target = "nobody-here/no-such-model"
    argv = [f"target={target}", f"checkpoint={draft}", f"engine={engine}", "dtype=float64"]
    assert launch.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("serve.launch: error: "), captured.err
    assert expected in lines[0] and "Traceback" not in captured.out


def test_a_port_in_use_is_refused_before_anything_is_read(pair, monkeypatch, capsys):
    target, draft = pair

    def forbidden(*a, **k):
        raise AssertionError("the launch went on past a port in use")

    monkeypatch.setattr(launch, "read_checked_draft", forbidden)
    monkeypatch.setattr(launch, "probe_vllm_version", forbidden)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        argv = [f"target={target}", f"checkpoint={draft}", f"port={port}"]
        assert launch.main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and f"port={port}: 127.0.0.1:{port} is already in use" in err[0]
        with pytest.raises(LaunchRefused, match="already in use"):
            launch.check_port_free("127.0.0.1", port)
    launch.check_port_free("127.0.0.1", port)  # closed again: free (TIME_WAIT is no refusal)
    with pytest.raises(LaunchRefused, match="cannot resolve"):
        launch.check_port_free("no-such-host.invalid", port)


def test_a_dry_run_does_not_bind(pair, no_gpu_no_vllm, monkeypatch, capsys):
    target, draft = pair
    monkeypatch.setattr(launch, "check_port_free", lambda *a: pytest.fail("bound on a dry run"))
    argv = [f"target={target}", f"checkpoint={draft}", "dry_run=true"]
    assert launch.main(argv) == 0


def test_one_problem_is_one_line_and_several_are_listed(pair, tmp_path):
    _, draft = pair
    assert launch.refusal("what", ["a"]) == "what: a"
    assert launch.refusal("what", ["a", "b"]) == "what:\n  a\n  b"
    bad = _bad_json(draft, tmp_path / "b")
    cfg = json.loads((draft / "config.json").read_text())
    cfg.pop("dspark_bonus_anchor"), cfg.pop("block_size")
    (bad / "config.json").write_text(json.dumps(cfg))
    contract, fit = common.contract.serving_problems(bad, pair[0])
    assert "config.json lacks block_size" in contract and fit == []  # no fit on a broken folder
    assert common.contract.serving_problems(draft, pair[0]) == ([], [])
