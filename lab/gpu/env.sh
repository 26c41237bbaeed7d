# Sourced by every lab/gpu/*.sh: carried wheels (.whl, or /tmp/carry/.whl where an earlier call
# left them; see prepare_carry.sh) into /tmp/site, the repo on PYTHONPATH, offline hub, $OUT (the
# device tool's return folder) defaulting to gpu-out.
# CARRY_DIR: where session.sh puts the carried files (lab/gpu/carry_pieces.py), /tmp/carry on
# the device; a rehearsal on the CPU points it elsewhere.
export CARRY_DIR="${CARRY_DIR:-/tmp/carry}"
for w in .whl "$CARRY_DIR/.whl"; do
  if [ -d "$w" ] && [ ! -f /tmp/site/.dspark-wheels ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$w"/*.whl && touch /tmp/site/.dspark-wheels
  fi
done
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:/tmp/site" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
export OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
# The lab's experiments (lab/configs/experiment/) beside the product's: pass to every train.distill.
export LAB_SEARCHPATH="hydra.searchpath=[file://$PWD/lab/configs]"
# vLLM's FlashInfer top-k/top-p sampler is compiled on a machine's first engine start: 126 s and
# 113 s after the memory profile in the first start of 2026-12-03 and 2026-12-04, 7-20 s in later
# starts on the same machine (779680f:docs/benchmarks.md, "More data, 2026-12-04"). Nothing here uses it:
# requests with their own seed (regeneration, the gates) take vLLM's native sampler, and the
# serving benchmarks are greedy.
export VLLM_USE_FLASHINFER_SAMPLER=0
# vLLM (vllm_install.sh puts it in /tmp/vsite): wait_for_vllm blocks until it is there, then adds it.
wait_for_vllm() {
  wait_for_files 1200 /tmp/vsite/.ready || { echo "vLLM never arrived in /tmp/vsite" >&2; return 1; }
  export PYTHONPATH="/tmp/vsite:$PYTHONPATH" VLLM_ENABLE_V1_MULTIPROCESSING=0
}
# first_draft DIR[,FALLBACK...]: the first that holds a draft checkpoint, on stdout (a draft
# trained earlier in the session may have failed; measuring the one before it still measures
# something). Says so on stderr when it is not the first; exit status 2, naming them, when none is.
first_draft() {
  local d all; IFS=, read -r -a all <<<"$1"
  for d in "${all[@]}"; do
    if [ -f "$d/config.json" ]; then
      [ "$d" = "${all[0]}" ] || echo "no checkpoint at ${all[0]}; using $d" >&2
      echo "$d"; return 0
    fi
  done
  echo "no draft checkpoint at ${1//,/ or }" >&2; return 2
}
# wait_for_files SECONDS FILE...: until every FILE exists (a later call of the session brings it;
# session.sh renames a file into place only once it is whole). Exit status 1, naming what is missing.
wait_for_files() {
  local limit=$1 f missing; shift
  for _ in $(seq $((limit / 5 + 1))); do
    missing=""; for f in "$@"; do [ -e "$f" ] || missing="$missing $f"; done
    [ -z "$missing" ] && return 0
    sleep 5
  done
  echo "never arrived within ${limit} s:$missing" >&2; return 1
}
# wait_healthy PORT PID [TRIES]: until http://127.0.0.1:PORT/health answers (2 s apart, TRIES
# times, default 150); exit status 1 when PID (the server) exits first or the tries run out.
wait_healthy() {
  local port=$1 pid=$2 _
  for _ in $(seq "${3:-150}"); do
    python3 -c "import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=2)" \
      "http://127.0.0.1:$port/health" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 1; sleep 2
  done
  return 1
}
