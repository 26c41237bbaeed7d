"""The research lab, fenced off from the product: nothing in common/, train/, serve/, configs/
or scripts/ imports it (tests/unit/test_import_arrows.py). lab/README.md holds the rules.

The lab's ablation experiments live in lab/configs/experiment/ and inherit the product's
(configs/experiment/); Hydra finds both through this search-path override, the one spelling of it
for Python callers (lab/gpu/env.sh and lab/analysis/cpu_overrides.sh spell it for bash)."""

from pathlib import Path

CONFIGS = Path(__file__).resolve().parent / "configs"
SEARCHPATH = f"hydra.searchpath=[file://{CONFIGS}]"
