#!/usr/bin/env bash
# SmolLM2, stage 2 (~3 min): the target answers the train and held-out ShareGPT prompts itself with
# vLLM (T=0.7, top-p 0.8, up to 512 new tokens), one engine start for both splits.
set -euo pipefail; cd "$(dirname "$0")/../.."; source scripts/gpu/env.sh; wait_for_vllm
D=artifacts/smollm2-data
python3 - <<'PY'
import json
with open("artifacts/smollm2-data/prompts.jsonl", "w") as out:
    for split in ("train", "heldout"):
        for line in open(f"artifacts/smollm2-data/sharegpt_{split}.jsonl"):
            out.write(json.dumps({**json.loads(line), "split": split}) + "\n")
PY
python3 -m train.regenerate --target artifacts/smollm2-135m-instruct --data $D/prompts.jsonl \
  --out $D/all.regen.jsonl --backend vllm --temperature 0.7 --top-p 0.8 --max-new-tokens 512 \
  --batch-size 4096 2>&1 | grep -v "it/s\]"
python3 - <<'PY'
import json
D = "artifacts/smollm2-data"
files = {s: open(f"{D}/{s}.regen.jsonl", "w") for s in ("train", "heldout")}
for line in open(f"{D}/all.regen.jsonl"):
    files[json.loads(line)["split"]].write(line)
for f in files.values():
    f.close()
summary = json.load(open(f"{D}/all.regen.jsonl.summary.json"))
for s in files:  # distill reads PATH.summary.json into the checkpoint's provenance
    json.dump({**summary, "split": s}, open(f"{D}/{s}.regen.jsonl.summary.json", "w"), indent=2)
PY
cp $D/all.regen.jsonl.summary.json "$OUT/regenerate_summary.json"; wc -l $D/*.regen.jsonl
