"""lab/gpu/carry_pieces.py: files cut into device calls of equal size come back whole, in any
order of calls, each file only once all its pieces came and its sha256 matches."""

import json
import os
import random

import pytest

from lab.gpu.carry_pieces import SLACK, CarryError, main, pack, pipeline_specs

CAP = 1000  # bytes of carries a call in these tests


@pytest.fixture
def device(tmp_path, monkeypatch):
    """The device's /tmp folders, redirected into tmp_path."""
    dirs = {k: tmp_path / "device" / k for k in ("carry", "vx", "pieces")}
    monkeypatch.setenv("CARRY_DIR", str(dirs["carry"]))
    monkeypatch.setenv("VX_DIR", str(dirs["vx"]))
    monkeypatch.setenv("PIECES_DIR", str(dirs["pieces"]))
    return dirs


def make_files(root, sizes: dict[str, int], seed: int = 0) -> dict[str, bytes]:
    rng = random.Random(seed)
    out = {}
    for rel, n in sizes.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        out[rel] = bytes(rng.getrandbits(8) for _ in range(n))
        path.write_bytes(out[rel])
    return out


def pack_small(repo, specs, cap=CAP):
    return pack(specs, repo, margin=0, tree=0, limit=cap + SLACK)


def calls(repo):
    return sorted(repo.glob(".k[0-9]*"), key=lambda p: int(p.name[2:]))


def join(folder) -> int:
    return main(["join", str(folder)])


def test_files_come_back_whole_whatever_the_order_of_the_calls(tmp_path, device):
    repo = tmp_path / "repo"
    data = make_files(
        repo,
        {
            "wheels/a.whl": 300,
            "wheels/b.whl": 0,
            "big.gguf": 2500,  # spans three calls
            "rows.jsonl.gz": 700,
            "vllm/vllmpart.00": 900,
            "vllm/dep.whl": 50,
        },
    )
    lines = pack_small(
        repo,
        [
            f"carry/.whl={repo / 'wheels'}",
            f"carry={repo / 'big.gguf'}",
            f"carry={repo / 'rows.jsonl.gz'}",
            f"vx={repo / 'vllm'}",
        ],
    )
    folders = calls(repo)
    assert len(folders) == 5 == len(lines) - 1  # 4,450 bytes at 1,000 a call
    for f in folders:  # each call holds at most CAP bytes of pieces beside its manifest
        assert sum(p.stat().st_size for p in f.iterdir() if p.name != "carry.json") <= CAP
    order = folders[:]
    random.Random(1).shuffle(order)
    for f in order[:-1]:
        assert join(f) == 0
    vx_calls = folders[3:]  # vLLM's files fill the last two calls
    assert main(["complete", "vx"]) == (1 if order[-1] in vx_calls else 0)
    assert join(order[-1]) == 0
    assert main(["complete", "vx"]) == 0 and main(["complete", "carry"]) == 0
    c, vx = device["carry"], device["vx"]
    assert (c / ".whl" / "a.whl").read_bytes() == data["wheels/a.whl"]
    assert (c / ".whl" / "b.whl").read_bytes() == b""
    assert (c / "big.gguf").read_bytes() == data["big.gguf"]
    assert (c / "rows.jsonl.gz").read_bytes() == data["rows.jsonl.gz"]
    assert (vx / "vllmpart.00").read_bytes() == data["vllm/vllmpart.00"]
    assert (vx / "dep.whl").read_bytes() == data["vllm/dep.whl"]
    assert sorted(p.name for p in device["pieces"].iterdir()) == ["carry.json"]  # pieces freed
    assert not [p for p in c.iterdir() if p.name.startswith((".part", ".joining"))]


def test_a_subfolder_appears_only_with_all_its_files(tmp_path, device):
    """env.sh installs /tmp/carry/.whl once it sees the folder: half of the wheels must not show."""
    repo = tmp_path / "repo"
    make_files(repo, {"wheels/a.whl": 800, "wheels/b.whl": 800})
    pack_small(repo, [f"carry/.whl={repo / 'wheels'}"])
    first, second = calls(repo)
    assert join(first) == 0
    assert not (device["carry"] / ".whl").exists()
    assert main(["complete", "carry/.whl"]) == 1
    assert join(second) == 0
    assert sorted(p.name for p in (device["carry"] / ".whl").iterdir()) == ["a.whl", "b.whl"]
    assert main(["complete", "carry/.whl"]) == 0


def test_a_call_carried_twice_changes_nothing(tmp_path, device):
    repo = tmp_path / "repo"
    make_files(repo, {"x.bin": 500})
    pack_small(repo, [f"carry={repo / 'x.bin'}"])
    (k1,) = calls(repo)
    assert join(k1) == 0
    before = os.stat(device["carry"] / "x.bin").st_mtime_ns
    assert join(k1) == 0
    assert os.stat(device["carry"] / "x.bin").st_mtime_ns == before


def test_a_damaged_piece_is_named_and_its_file_never_appears(tmp_path, device, capsys):
    repo = tmp_path / "repo"
    make_files(repo, {"x.bin": 1500})
    pack_small(repo, [f"carry={repo / 'x.bin'}"])
    k1, k2 = calls(repo)
    piece = next(p for p in k2.iterdir() if p.name != "carry.json")
    piece.write_bytes(b"\0" * piece.stat().st_size)
    assert join(k1) == 0
    assert join(k2) == 1
    assert "carry/x.bin: its joined pieces do not match its sha256" in capsys.readouterr().err
    assert not (device["carry"] / "x.bin").exists()
    assert not list(device["carry"].glob(".joining*"))


def test_a_call_of_another_pack_is_refused(tmp_path, device, capsys):
    repo = tmp_path / "repo"
    make_files(repo, {"x.bin": 1500})
    pack_small(repo, [f"carry={repo / 'x.bin'}"])
    k1 = calls(repo)[0]
    assert join(k1) == 0
    make_files(repo, {"x.bin": 1500}, seed=7)  # the files changed and were packed again
    pack_small(repo, [f"carry={repo / 'x.bin'}"])
    assert join(calls(repo)[1]) == 2
    assert "holds pieces of pack" in capsys.readouterr().err


def test_waiting_files_name_the_calls_that_bring_them(tmp_path, device, capsys):
    repo = tmp_path / "repo"
    make_files(repo, {"x.bin": 2500})
    pack_small(repo, [f"carry={repo / 'x.bin'}"])
    assert join(calls(repo)[0]) == 0
    assert "carry/x.bin (pieces in .k2, .k3)" in capsys.readouterr().out


def test_a_new_pack_replaces_the_old_calls(tmp_path):
    repo = tmp_path / "repo"
    make_files(repo, {"x.bin": 2500, "y.bin": 10})
    pack_small(repo, [f"carry={repo / 'x.bin'}"])
    assert len(calls(repo)) == 3
    pack_small(repo, [f"carry={repo / 'y.bin'}"])
    (k1,) = calls(repo)
    names = [e["name"] for e in json.loads((k1 / "carry.json").read_text())["files"]]
    assert names == ["y.bin"]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("carry", "expected DEST=PATH"),
        ("tmp={x}", "optionally /SUBFOLDER"),
        ("carry/a/b={x}", "optionally /SUBFOLDER"),
        ("carry={missing}", "no such file or folder"),
        ("carry={nested}", "only files are carried"),
    ],
)
def test_bad_specs_are_refused_by_name(tmp_path, spec, message):
    repo = tmp_path / "repo"
    make_files(repo, {"x.bin": 10, "nested/sub/y.bin": 10})
    spec = spec.format(x=repo / "x.bin", missing=repo / "nope", nested=repo / "nested")
    with pytest.raises(CarryError, match=message):
        pack_small(repo, [spec])


def test_two_files_of_one_name_for_one_place_are_refused(tmp_path):
    repo = tmp_path / "repo"
    make_files(repo, {"a/x.bin": 10, "b/x.bin": 10})
    with pytest.raises(CarryError, match="both go to carry/x.bin"):
        pack_small(repo, [f"carry={repo / 'a'}", f"carry={repo / 'b'}"])
    pack_small(repo, [f"carry={repo / 'a'}", f"vx={repo / 'b'}"])  # different places: fine


def test_no_room_beside_the_tree_is_an_error(tmp_path):
    repo = tmp_path / "repo"
    make_files(repo, {"x.bin": 10})
    with pytest.raises(CarryError, match="no room in a call"):
        pack([f"carry={repo / 'x.bin'}"], repo, margin=0, tree=SLACK + 1, limit=SLACK)


def test_a_pipeline_names_its_carries_on_pack_lines(tmp_path):
    stages = tmp_path / "x.stages"
    stages.write_text("# header\n#pack carry/.whl=.whl carry=.data/a.gz\n#pack vx=.c1\nt t.sh\n")
    assert pipeline_specs(stages) == ["carry/.whl=.whl", "carry=.data/a.gz", "vx=.c1"]
    stages.write_text("# header\nt t.sh\n")
    with pytest.raises(CarryError, match="has no `#pack"):
        pipeline_specs(stages)


def test_relative_paths_are_read_from_the_repo(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    make_files(repo, {".gguf/model.gguf": 10})
    monkeypatch.chdir(tmp_path)  # not the repo
    pack_small(repo, ["carry=.gguf"])
    (k1,) = calls(repo)
    assert [e["name"] for e in json.loads((k1 / "carry.json").read_text())["files"]] == [
        "model.gguf"
    ]
