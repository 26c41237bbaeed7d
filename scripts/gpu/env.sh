# Sourced by every scripts/gpu/*.sh: carried wheels (.whl, see README "GPU runs") into /tmp/site,
# the repo on PYTHONPATH, offline hub, $OUT (the device tool's return folder) defaulting to gpu-out.
if [ -d .whl ] && [ ! -f /tmp/site/.dspark-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.dspark-wheels
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:/tmp/site" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
export OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
