#!/usr/bin/env bash
# SmolLM2, stage 3: distill drafts side by side on the one GPU (each run is mostly launch-bound at
# this size, so two processes finish in about the time of one).
#   bash lab/gpu/smollm2_distill.sh [EXPERIMENT...] [HYDRA_OVERRIDE...]
# EXPERIMENTs (configs/experiment/*.yaml; default: smollm2_dspark smollm2_dflash, DSpark and DFlash at
# equal budget: same data, steps, seed, draft size and draft vocabulary); arguments with '=' are
# Hydra overrides given to every run.
set -uo pipefail; cd "$(dirname "$0")/../.."; source lab/gpu/env.sh
EXPS=() OVERRIDES=()
for a in "$@"; do case "$a" in *=*) OVERRIDES+=("$a") ;; *) EXPS+=("$a") ;; esac; done
[ ${#EXPS[@]} -gt 0 ] || EXPS=(smollm2_dspark smollm2_dflash)
for e in "${EXPS[@]}"; do
  [ -f "configs/experiment/$e.yaml" ] || { echo "no configs/experiment/$e.yaml" >&2; exit 2; }
done
# torch.compile's artifacts (train/loop/compile_cache.py): from /tmp/carry/compile_cache.bin where a
# session carried one in, else written here at the runs' ends (their logs give its size; not
# shipped back yet, so it does not take a poll's room from the drafts).
# (Not named CC: the device's environment exports CC, the C compiler Triton builds its helpers
# with, and 2026-12-05's distill stage failed calling this file as one.)
CACHE_FILE=/tmp/dspark-compile-cache.bin
[ -f $CACHE_FILE ] || [ ! -f "$CARRY_DIR/compile_cache.bin" ] || cp "$CARRY_DIR/compile_cache.bin" $CACHE_FILE
for e in "${EXPS[@]}"; do
  python3 -m train.distill "$LAB_SEARCHPATH" +experiment=$e overwrite=true trainer.progress=false trainer.print_every=25 \
    trainer.compile_cache=$CACHE_FILE "${OVERRIDES[@]}" >"$OUT/$e.log" 2>&1 &
done
wait; rc=0
# The compile caches the runs left (kernels and graphs): how much a later session would carry to
# skip the compiles (each run's log says what its first evaluation and step took).
du -sh /tmp/torchinductor_* /tmp/triton* ~/.triton 2>/dev/null | tee "$OUT/compile_cache_size.txt"
for e in "${EXPS[@]}"; do
  tail -4 "$OUT/$e.log"
  cp outputs/$e/metrics.jsonl "$OUT/$e.metrics.jsonl" && cp outputs/$e/summary.json "$OUT/$e.summary.json" || rc=1
done
exit $rc
