"""train.publish.push against tests.fake_hub: byte-identical upload, refusals before any request,
offline
mode, auth and network errors; injected Hub faults retried with backoff, resumed without re-sending
what landed, success only once every hash matches. HF_HUB_OFFLINE stays set except inside the
`online` fixture."""

from __future__ import annotations

import socket

import pytest
from huggingface_hub import constants
from safetensors.torch import load_file, save_file

from tests.fake_hub import FakeHub, git_blob_sha1
from tests.unit.test_model_card import METRICS, RECIPE, write_tiny_checkpoint
from train.publish.model_card import write_model_card
from train.publish.push import PushFailed, PushRefused, main, push_checkpoint

TOKEN = "hf_fake_write_token"
FILES = ["README.md", "config.json", "model.safetensors", "provenance.json"]


@pytest.fixture
def offline(monkeypatch):
    """The suite's default: huggingface_hub must not reach anything."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def online(monkeypatch):
    """Lift offline mode for one test. huggingface_hub reads HF_HUB_OFFLINE once, at import, into
    `constants.HF_HUB_OFFLINE` (what `is_offline_mode()` and the request hook check), so both the
    variable and the constant are patched; monkeypatch restores them afterwards."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def ckpt(tmp_path):
    out = write_tiny_checkpoint(tmp_path / "draft")
    write_model_card(
        out,
        target="Qwen/Qwen3-8B",
        recipe=RECIPE,
        metrics=METRICS,
        per_position_acceptance=[0.9, 0.8, 0.7, 0.6],
        repo_id="org/tiny-dspark",
    )
    return out


@pytest.fixture
def hub():
    with FakeHub(token=TOKEN, lifetime_s=60) as h:
        yield h


def _argv(ckpt, hub, *extra):
    return [
        str(ckpt),
        "--repo-id",
        "org/tiny-dspark",
        "--token",
        TOKEN,
        "--endpoint",
        hub.url,
        *extra,
    ]


def test_push_uploads_every_file_byte_identical(online, ckpt, hub, capsys):
    (ckpt / ".README.md.tmp-1").write_text("half-written")  # hidden files never travel
    assert main(_argv(ckpt, hub, "--private", "--commit-message", "tiny draft")) == 0
    assert f"{hub.url}/org/tiny-dspark" in capsys.readouterr().out
    repo = hub.repos["org/tiny-dspark"]
    assert sorted(repo.files) == FILES
    for name in FILES:
        assert repo.files[name] == (ckpt / name).read_bytes(), name
    assert repo.private
    assert [c["summary"] for c in repo.commits] == ["tiny draft"]
    assert hub.unhandled == []

    # Pushing the same folder again: the repo exists (409 is fine), nothing changed, no new commit.
    url = push_checkpoint(ckpt, "org/tiny-dspark", token=TOKEN, endpoint=hub.url)
    assert url == f"{hub.url}/org/tiny-dspark"
    assert len(repo.commits) == 1
    assert hub.unhandled == []


def test_invalid_checkpoint_refused_before_any_request(online, ckpt, hub, capsys):
    weights = ckpt / "model.safetensors"
    tensors = load_file(str(weights))
    del tensors["d2t"]  # a reduced-vocab draft without its map: vLLM would load it silently
    save_file(tensors, str(weights))
    (ckpt / "README.md").unlink()
    assert main(_argv(ckpt, hub)) == 2
    err = capsys.readouterr().err
    assert "missing tensor d2t (32,)" in err
    assert "model card) is missing" in err  # every problem, not just the first
    assert hub.requests == []


def test_missing_card_allowed_with_flag(online, ckpt, hub):
    (ckpt / "README.md").unlink()
    with pytest.raises(PushRefused, match="--allow-no-card"):
        push_checkpoint(ckpt, "org/tiny-dspark", token=TOKEN, endpoint=hub.url)
    assert hub.requests == []
    assert main(_argv(ckpt, hub, "--allow-no-card")) == 0
    assert sorted(hub.repos["org/tiny-dspark"].files) == FILES[1:]


def test_bad_repo_id_refused(online, ckpt, hub):
    with pytest.raises(PushRefused, match="give ORG/NAME") as e:
        push_checkpoint(ckpt, "tiny-dspark", token=TOKEN, endpoint=hub.url)
    assert len(e.value.problems) == 1
    assert hub.requests == []


def test_offline_mode_is_a_clear_refusal(offline, ckpt, hub, capsys):
    assert main(_argv(ckpt, hub)) == 2
    err = capsys.readouterr().err
    assert "HF_HUB_OFFLINE=1 is set" in err and "unset it" in err
    assert hub.requests == []


def test_offline_constant_without_variable(monkeypatch, ckpt, hub):
    # Imported while offline, variable unset later: huggingface_hub is still offline; say so.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(PushRefused, match="unset HF_HUB_OFFLINE before starting Python"):
        push_checkpoint(ckpt, "org/tiny-dspark", token=TOKEN, endpoint=hub.url)
    assert hub.requests == []


def test_bad_token_is_an_auth_error(online, ckpt, hub, capsys):
    assert main([*_argv(ckpt, hub)[:3], "--token", "hf_wrong", "--endpoint", hub.url]) == 1
    err = capsys.readouterr().err
    assert "authentication failed" in err and "HF_TOKEN" in err
    assert "hf_wrong" not in err
    assert "org/tiny-dspark" not in hub.repos


def test_unreachable_endpoint_is_a_network_error(online, ckpt):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(PushFailed, match="could not reach"):
        push_checkpoint(
            ckpt,
            "org/tiny-dspark",
            token=TOKEN,
            endpoint=f"http://127.0.0.1:{port}",
            sleep=lambda s: None,
        )


# ---------------------------------------------------------------- injected Hub faults
REPO = "org/tiny-dspark"


def _push(ckpt, hub, sleeps, **kw):
    return push_checkpoint(ckpt, REPO, token=TOKEN, endpoint=hub.url, sleep=sleeps.append, **kw)


def _commits(hub):
    return [(m, p) for m, p in hub.requests if p.endswith("/commit/main")]


def _assert_landed(ckpt, hub):
    repo = hub.repos[REPO]
    assert sorted(repo.files) == FILES
    for name in FILES:
        assert git_blob_sha1(repo.files[name]) == git_blob_sha1((ckpt / name).read_bytes())


def test_upload_failing_three_times_completes_with_hashes_verified(online, ckpt, hub):
    hub.inject("commit", 2, "503")
    hub.inject("commit", 1, "drop")  # the connection dies mid-upload
    sleeps = []
    url = _push(ckpt, hub, sleeps)
    assert url.endswith(REPO)
    _assert_landed(ckpt, hub)
    assert sleeps == [2.0, 4.0, 8.0]  # exponential backoff, one wait per failure
    assert len(_commits(hub)) == 4 and len(hub.repos[REPO].commits) == 1
    # Verified by listing after the commit: the last request is the tree listing.
    assert hub.requests[-1] == ("GET", f"/api/models/{REPO}/tree/main")
    assert hub.unhandled == []


def test_interrupted_after_the_hub_took_the_files_is_not_resent(online, ckpt, hub):
    hub.inject("commit", 1, "drop_after")  # committed, but the answer never arrives
    sleeps = []
    _push(ckpt, hub, sleeps)
    _assert_landed(ckpt, hub)
    assert len(sleeps) == 1 and len(_commits(hub)) == 1 and len(hub.repos[REPO].commits) == 1


def test_only_missing_or_changed_files_are_sent(online, ckpt, hub):
    _push(ckpt, hub, [])
    (ckpt / "README.md").write_text((ckpt / "README.md").read_text() + "\nmore\n")
    _push(ckpt, hub, [])
    commits = hub.repos[REPO].commits
    assert len(commits) == 2 and commits[1]["paths"] == ["README.md"]
    _push(ckpt, hub, [])  # nothing changed: no commit at all
    assert len(hub.repos[REPO].commits) == 2


def test_never_success_when_a_file_lands_with_other_bytes(online, ckpt, hub):
    hub.corrupt_paths.add("model.safetensors")
    sleeps = []
    with pytest.raises(PushFailed, match=r"did not complete in 3 attempts.*model\.safetensors"):
        _push(ckpt, hub, sleeps, attempts=3)
    assert sleeps == [2.0, 4.0]


def test_retries_are_bounded_and_auth_errors_are_not_retried(online, ckpt, hub):
    hub.inject("commit", 10, "503")
    sleeps = []
    with pytest.raises(PushFailed, match="did not complete in 5 attempts"):
        _push(ckpt, hub, sleeps, max_backoff_s=5.0)
    assert sleeps == [2.0, 4.0, 5.0, 5.0]
    assert len(_commits(hub)) == 5
    with pytest.raises(PushFailed, match="authentication failed"):
        push_checkpoint(ckpt, REPO, token="hf_wrong", endpoint=hub.url, sleep=sleeps.append)
    assert len(sleeps) == 4


def test_dry_run_lists_the_files_and_the_repo_and_sends_nothing(offline, ckpt, hub, capsys):
    """Offline too: a dry run sends no request, so it needs none."""
    (ckpt / ".README.md.tmp-1").write_text("half-written")  # hidden: not listed, as not pushed
    assert main(_argv(ckpt, hub, "--dry-run", "--private")) == 0
    lines = capsys.readouterr().out.splitlines()
    total = sum((ckpt / name).stat().st_size for name in FILES)
    assert lines[0] == (
        f"dry run: would push 4 files ({total / 1024:.1f} KB) from {ckpt} to "
        f"{hub.url}/org/tiny-dspark (created if new, private); nothing was sent"
    )
    listed = [line.split()[0] for line in lines[1:5]]
    assert listed == FILES
    for line in lines[1:5]:
        name, size, unit = line.split()
        n = (ckpt / name).stat().st_size
        assert f"{size} {unit}" == (f"{n} B" if n < 1024 else f"{n / 1024:.1f} KB")
    assert lines[5] == "a real push sends only the files the repo lacks or holds with other bytes"
    assert lines[6].startswith("note: HF_HUB_OFFLINE=1 is set")
    assert hub.requests == []


def test_dry_run_refuses_what_a_push_would_refuse(online, ckpt, hub, capsys):
    (ckpt / "README.md").unlink()
    assert main(_argv(ckpt, hub, "--dry-run")) == 2
    assert "model card) is missing" in capsys.readouterr().err
    assert hub.requests == []


def test_a_truncated_weights_file_is_one_refusal_line(online, ckpt, hub, capsys):
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-7])
    assert main(_argv(ckpt, hub)) == 2
    err = capsys.readouterr().err
    assert f"  - contract: {weights} is truncated: expected {len(data)} bytes (from its " in err
    assert f"found {len(data) - 7}; copy or download it again" in err
    assert "Traceback" not in err and "SafetensorError" not in err
    assert hub.requests == []
