"""train/data/pypackages.py: HumanEval-form code prompts from installed packages, at most
`per_package` a package (a seeded sample), a task seen in an earlier package skipped;
`python -m train.prepare.data pypackages` writes them as a train split."""

import gzip
import json
import sys

import pytest

from train.data.humaneval import INSTRUCTION
from train.data.pypackages import pypackages_rows
from train.prepare.data import main


def function(name: str) -> str:
    return f'def {name}(x):\n    """Return {name} of x, a number, as a float."""\n    return x\n'


@pytest.fixture
def site(tmp_path, monkeypatch):
    """Two importable packages: alpha with 5 documented functions (and a tests folder), beta
    with 2, one of them alpha's again; `empty` with none."""
    root = tmp_path / "site"
    alpha = root / "alpha"
    (alpha / "tests").mkdir(parents=True)
    (alpha / "__init__.py").write_text("")
    (alpha / "core.py").write_text("".join(function(f"f{i}") for i in range(5)))
    (alpha / "tests" / "test_core.py").write_text(function("never"))
    (root / "beta").mkdir()
    (root / "beta" / "__init__.py").write_text(function("f0") + function("g"))
    (root / "empty").mkdir()
    (root / "empty" / "__init__.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in ("alpha", "beta", "empty"):
        sys.modules.pop(name, None)


def test_rows_name_their_package_and_skip_tests_and_repeats(site):
    rows, report = pypackages_rows(["alpha", "beta"], per_package=None)
    ids = sorted(r["id"] for r in rows)
    assert ids == [
        *(f"pypackages/alpha/core.py:f{i}" for i in range(5)),
        "pypackages/beta/__init__.py:g",
    ]
    assert all(r["messages"][0]["content"].startswith(INSTRUCTION + "def ") for r in rows)
    assert report["packages"]["alpha"] == {"version": None, "found": 5, "kept": 5}
    assert report["packages"]["beta"]["found"] == 1  # f0 was alpha's already
    assert report["duplicate_tasks"] == 1 and report["found"] == report["kept"] == 6


def test_per_package_keeps_a_seeded_sample_and_max_rows_cuts_the_shuffle(site):
    rows, report = pypackages_rows(["alpha", "beta"], seed=1, per_package=2)
    alpha = [r["id"] for r in rows if r["id"].startswith("pypackages/alpha/")]
    assert len(alpha) == 2 and report["packages"]["alpha"] == {
        "version": None,
        "found": 5,
        "kept": 2,
    }
    assert report["found"] == 6 and report["after_per_package"] == 3 == report["kept"]
    assert rows == pypackages_rows(["alpha", "beta"], seed=1, per_package=2)[0]
    cut, report = pypackages_rows(["alpha", "beta"], seed=1, per_package=2, max_rows=2)
    assert cut == rows[:2] and report["kept"] == 2
    other = {r["id"] for r in pypackages_rows(["alpha"], seed=2, per_package=2)[0]}
    samples = {
        frozenset(r["id"] for r in pypackages_rows(["alpha"], seed=s, per_package=2)[0])
        for s in range(6)
    }
    assert len(other) == 2 and len(samples) > 1  # the seed picks the sample


def test_a_missing_or_empty_package_is_an_error_naming_it(site):
    with pytest.raises(ValueError, match="no_such_package: not an installed package"):
        pypackages_rows(["alpha", "no_such_package"])
    with pytest.raises(ValueError, match=r"\['empty'\]: no documented public functions"):
        pypackages_rows(["alpha", "empty"])
    with pytest.raises(ValueError, match="no packages"):
        pypackages_rows([])


def test_prepare_data_writes_the_packages_as_a_train_split(site, tmp_path):
    out = tmp_path / "out"
    args = ["pypackages", "--out", str(out), "--gzip", "--packages", "beta", "alpha"]
    assert main([*args, "--per-package", "3"]) == 0
    with gzip.open(out / "pypackages-train.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    report = json.loads((out / "pypackages-report.json").read_text())
    assert list(report["packages"]) == ["beta", "alpha"] and report["per_package"] == 3
    assert len(rows) == 5 == report["kept"]  # beta's 2, then 3 of alpha's 4 new ones
    assert main(["pypackages", "--out", str(out), "--packages", "no_such_package"]) == 2
    for bad in (["--turns", "first"], ["--per-package", "0"]):
        with pytest.raises(SystemExit):
            main(["pypackages", "--out", str(out), *bad])
    with pytest.raises(SystemExit):
        main(["pystdlib", "--out", str(out), "--packages", "alpha"])
