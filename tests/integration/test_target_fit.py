"""A draft that does not fit its target is refused before serving, by `serve.check --target` and by
both launcher branches, naming the field and both values; the matching pair passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from common.target_fit import TOKENIZER_HASH_KEY, checkpoint_fit_problems, tokenizer_hash
from serve import check, launch
from tests.unit.test_engine_helpers import (
    make_draft,
    make_target,
    make_tokenizer,
    save_draft,
    save_target,
)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("fit")
    target = make_target(0)
    save_target(target, root / "target")
    draft = save_draft(make_draft(target), root / "draft")
    return root, root / "target", draft


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _edit_json(path: Path, **changes) -> None:
    raw = json.loads(path.read_text())
    for key, value in changes.items():
        node = raw
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    path.write_text(json.dumps(raw))


def _other_target(root: Path, name: str, **config) -> Path:
    """The target folder with config.json edited (the checks read only the config)."""
    out = _copy(root / "target", root / name)
    _edit_json(out / "config.json", **config)
    return out


def _moved_mask_target(root: Path) -> Path:
    """Same model, a tokenizer in which '<mask>' is id 5 instead of 2."""
    out = _copy(root / "target", root / "moved_mask")
    words = ["<pad>", "<eos>", "w0", "<unk>", "w1", "<mask>"] + [f"w{i}" for i in range(2, 92)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out / f).unlink(missing_ok=True)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<pad>")
    tok.save_pretrained(out)
    return out


NAMED_MASK = {"draft": {"mask_token": "<mask>"}}
# field -> (how to break the pair, expected words of the refusal)
CASES = {
    "hidden size": (
        lambda root, t, d: (_other_target(root, "wide", hidden_size=48), d),
        "target_hidden_size: draft 32, target 48",
    ),
    "vocab": (
        lambda root, t, d: (_other_target(root, "vocab", vocab_size=104), d),
        "vocab_size: draft 96, target 104",
    ),
    "layer ids": (
        lambda root, t, d: (
            _other_target(root, "shallow", num_hidden_layers=2, layer_types=["full_attention"] * 2),
            d,
        ),
        "target_layer_ids: draft [0, 2], target has 2 layers",
    ),
    "mask token": (
        lambda root, t, d: (
            _moved_mask_target(root),
            _draft_with(
                d, root / "named_mask", {}, {"resolved_config": {"draft": {"mask_token": "<mask>"}}}
            ),
        ),
        "mask_token: draft trained with '<mask>' = id 2, the target tokenizer maps it to 5",
    ),
    "mask id": (
        lambda root, t, d: (_other_target(root, "small_vocab", vocab_size=2), d),
        "mask_token_id: draft 2, target vocab is [0, 2): outside it",
    ),
    "block layout": (
        lambda root, t, d: (
            t,
            _draft_with(d, root / "layout", {}, {"dspark_config.block_size": 8}),
        ),
        "block layout block_size: config.json 4, trained 8",
    ),
    "rope": (
        lambda root, t, d: (
            _other_target(root, "rope", **{"rope_parameters.rope_theta": 500.0}),
            d,
        ),
        "rope_theta: draft",
    ),
    # Widths, vocab and layers all fit; only a key the config hash covers differs (another model).
    "config hash": (
        lambda root, t, d: (_other_target(root, "ffn", intermediate_size=96), d),
        "target_config_hash: draft ",
    ),
    "tokenizer": (
        lambda root, t, d: (t, _draft_with(d, root / "tok", {}, {TOKENIZER_HASH_KEY: "0" * 16})),
        "tokenizer: draft trained with tokenizer hash 0000000000000000, target tokenizer hash",
    ),
}


def _draft_with(src: Path, dst: Path, config: dict, provenance: dict | None = None) -> Path:
    out = _copy(src, dst)
    if config:
        _edit_json(out / "config.json", **config)
    if provenance:
        _edit_json(out / "provenance.json", **provenance)
    return out


def test_matching_pair_passes_everywhere(pair, capsys):
    root, target, draft = pair
    assert checkpoint_fit_problems(draft, target) == []
    assert check.main([str(draft), "--target", str(target)]) == 0
    assert "OK for target" in capsys.readouterr().out


def test_recorded_tokenizer_hash_matches_an_identical_tokenizer(pair):
    root, target, draft = pair
    same = _draft_with(draft, root / "same_tok", {}, {TOKENIZER_HASH_KEY: "x"})
    _edit_json(same / "provenance.json", **{TOKENIZER_HASH_KEY: tokenizer_hash(make_tokenizer())})
    assert checkpoint_fit_problems(same, target) == []


@pytest.fixture
def no_engine(monkeypatch):
    """Any engine start or vLLM probe fails the test: refusals must come first."""

    def forbidden(*a, **k):
        raise AssertionError("an engine was started or probed before the refusal")

    from serve import launch

    for probe in ("exec_command", "probe_vllm_version", "probe_cuda_devices"):
        monkeypatch.setattr(launch, probe, forbidden)
    monkeypatch.setattr(launch, "check_port_free", lambda host, port: None)
    import serve.api.server

    monkeypatch.setattr(serve.api.server, "run_server", forbidden)


@pytest.mark.parametrize("field", sorted(CASES))
def test_each_mismatched_field_is_refused_before_any_engine(pair, field, no_engine, capsys):
    root, target, draft = pair
    breaker, expected = CASES[field]
    bad_target, bad_draft = breaker(_fresh(root, field), target, draft)
    problems = checkpoint_fit_problems(bad_draft, bad_target)
    assert any(expected in p for p in problems), problems
    assert check.main([str(bad_draft), "--target", str(bad_target)]) == 1
    assert expected in capsys.readouterr().out
    for engine in ("vllm", "embedded"):
        argv = [f"target={bad_target}", f"checkpoint={bad_draft}", f"engine={engine}"]
        assert launch.main(argv) == 2
        err = capsys.readouterr().err
        assert "does not fit target" in err and expected in err, err


def _fresh(root: Path, field: str) -> Path:
    d = root / field.replace(" ", "_")
    d.mkdir()
    (d / "target").symlink_to(root / "target", target_is_directory=True)
    return d


def test_mask_id_past_the_tokenizer_is_allowed(pair):
    """Qwen3's recipe feeds id 151669 = len(tokenizer), an unused embedding row: not a misfit."""
    from common.checkpoint import read_config
    from common.target_fit import fit_problems, target_text_config

    root, target, draft = pair
    cfg = read_config(draft)
    cfg.mask_token_id = 95  # the last embedding row
    small = type("Tok", (), {"__len__": lambda self: 60})()
    assert fit_problems(cfg, target_text_config(target), small) == []
    cfg.mask_token_id = 96
    assert any(
        "mask_token_id: draft 96" in p for p in fit_problems(cfg, target_text_config(target))
    )


AUTO_REQUEST = {"resolved_config": {"draft": {"mask_token": "auto", "mask_token_id": None}}}


@pytest.mark.parametrize(
    "record",
    [
        {"id": 2, "token": "<mask>", "how": "the tokenizer's mask_token"},
        {"id": 2, "token": None, "how": "an embedding row no text tokenizes to"},
    ],
)
def test_mask_chosen_by_auto_is_checked_by_what_was_chosen(pair, record):
    """The default `draft.mask_token=auto` is a request, not a token: the check reads the recorded
    choice (provenance["mask_token"]), skips the by-name check when the choice has no token string,
    and still refuses when the chosen token moved in the serving tokenizer."""
    root, target, draft = pair
    name = f"auto_{record['token'] is not None}"
    chosen = _draft_with(draft, root / name, {}, {**AUTO_REQUEST, "mask_token": record})
    assert checkpoint_fit_problems(chosen, target) == []
    moved = _moved_mask_target(_fresh(root, name + "_target"))
    problems = checkpoint_fit_problems(chosen, moved)
    refused = any("mask_token: draft trained with '<mask>' = id 2" in p for p in problems)
    assert refused == (record["token"] is not None), problems


def test_requested_auto_without_a_record_is_not_a_token_name(pair):
    """An export without the choice record asks nothing of the tokenizer for 'auto'."""
    root, target, draft = pair
    old = _draft_with(draft, root / "auto_unrecorded", {}, AUTO_REQUEST)
    assert checkpoint_fit_problems(old, target) == []
