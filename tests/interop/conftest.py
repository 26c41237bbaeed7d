"""Interoperability suite: our checkpoints and loss against `speculators==0.9.0` and
`specforge==0.2.0`, the ecosystem's own DSpark code.

Runs only in its own venv (`scripts/test_interop.sh`): in the main env, where neither package is
installed, nothing here is collected. Sizes are tiny; everything runs on CPU in fp32.
"""

from __future__ import annotations

import importlib.util
import os

HAVE_SPECULATORS = importlib.util.find_spec("speculators") is not None
HAVE_SPECFORGE = importlib.util.find_spec("specforge") is not None
if not HAVE_SPECULATORS:
    collect_ignore_glob = ["test_speculators*.py"]
if not HAVE_SPECFORGE:
    collect_ignore_glob = [*globals().get("collect_ignore_glob", []), "test_specforge*.py"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_report_header(config):
    from importlib import metadata

    out = []
    for dist in ("speculators", "specforge", "torch", "transformers"):
        try:
            out.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            out.append(f"{dist} absent")
    return "interop under test: " + ", ".join(out)
