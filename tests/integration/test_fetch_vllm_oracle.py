"""scripts/fetch_vllm_oracle.sh leaves nothing in the temporary folder, whether it succeeds or not.

Each CI run fetches the 228-MB vLLM wheel into a folder of its own; left behind, those folders
filled the disk and failed a CI run. pip is replaced by a stand-in on PATH (no network, no wheel):
`pip download` writes a small wheel holding the three files, `pip install --target` makes the
folder, and with FAIL_DOWNLOAD set the download fails.
"""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "fetch_vllm_oracle.sh"

FAKE_PYTHON = """#!/usr/bin/env bash
if [[ "$1" == "-m" && "$2" == "pip" ]]; then
    case "$3" in
        download)
            [[ -n "${FAIL_DOWNLOAD:-}" ]] && { echo "no network" >&2; exit 1; }
            while [[ $# -gt 0 && "$1" != "-d" ]]; do shift; done
            exec "$REAL_PYTHON" - "$2" <<'PY'
import sys, zipfile
name = "vllm/v1/worker/gpu/spec_decode/"
with zipfile.ZipFile(sys.argv[1] + "/vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl", "w") as z:
    for f in ("adaptive_verification.py", "acceptance_estimator.py", "dspark/speculator.py"):
        z.writestr(name + f, "# stand-in\\n")
PY
            ;;
        install)
            while [[ $# -gt 0 && "$1" != "--target" ]]; do shift; done
            mkdir -p "$2"; exit 0 ;;
    esac
fi
exec "$REAL_PYTHON" "$@"
"""


def _run(tmp_path: Path, fail: bool) -> subprocess.CompletedProcess:
    bin_dir, scratch = tmp_path / "bin", tmp_path / "scratch"
    bin_dir.mkdir()
    scratch.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_WHEEL_DIR"}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        REAL_PYTHON=sys.executable,
        TMPDIR=str(scratch),
        VLLM_ORACLE_DIR=str(tmp_path / "oracle"),
    )
    if fail:
        env["FAIL_DOWNLOAD"] = "1"
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)


@pytest.mark.parametrize("fail", [False, True], ids=["fetched", "download_failed"])
def test_the_wheel_folder_is_removed(tmp_path, fail):
    out = _run(tmp_path, fail)
    assert (out.returncode != 0) == fail, out.stderr
    assert list((tmp_path / "scratch").iterdir()) == []
    fetched = tmp_path / "oracle" / "src" / "vllm/v1/worker/gpu/spec_decode/dspark/speculator.py"
    assert fetched.is_file() != fail
    assert (tmp_path / "oracle" / ".stamp").is_file() != fail
