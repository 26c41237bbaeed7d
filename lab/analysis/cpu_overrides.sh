# Sourced, not run: the overrides that run a GPU experiment (e.g. +experiment=smollm2_dspark_16k_wsd)
# on this machine's CPU, as one bash array, CPU_OVERRIDES: the CPU trainer preset, and the speed
# settings the trainer refuses off a GPU (train/data/splits.py, apply_speed_settings) at their defaults.
#   source lab/analysis/cpu_overrides.sh; python3 -m train.distill +experiment=NAME "${CPU_OVERRIDES[@]}" ...
# shellcheck disable=SC2034  # used by the scripts that source it
CPU_OVERRIDES=(
  "hydra.searchpath=[file://$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/configs]"  # lab experiments
  trainer=cpu trainer.draft_attention=sdpa trainer.target_attention=sdpa
  trainer.compile_draft=false trainer.compile_target=false trainer.compile_loss=false
)
