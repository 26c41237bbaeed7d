#!/usr/bin/env bash
# SmolLM2, stage 2 (~7 min on 2026-12-03): the target answers the train and held-out ShareGPT prompts
# itself with vLLM (T=0.7, top-p 0.8, up to 512 new tokens), one engine start for both splits.
# REGEN_SAMPLES=K writes each train prompt K times: every row has its own seed, so K answers per
# prompt (held-out prompts once). The 2,000-step run began to over-fit one answer per prompt.
# REGEN_CUDA_GRAPHS=1 runs vLLM with CUDA graphs and 1024 running requests (eager: 9.8k tokens/s,
# launch-bound at this model size; the graph run's rate was not measured yet).
set -euo pipefail; cd "$(dirname "$0")/../.."; source scripts/gpu/env.sh
BACKEND="${REGEN_BACKEND:-vllm}"; [ "$BACKEND" = vllm ] && wait_for_vllm
D=artifacts/smollm2-data
REGEN_SAMPLES="${REGEN_SAMPLES:-1}" python3 - <<'PY'  # one input file for both splits; prompts
import json, os  # over 1536 tokens dropped (counted), so prompt + 512 new tokens fits seq_len 2048
from transformers import AutoTokenizer
from scripts.eval_acceptance import prompt_messages
D = "artifacts/smollm2-data"
tok = AutoTokenizer.from_pretrained("artifacts/smollm2-135m-instruct")
kept, dropped = {}, {}
with open(f"{D}/prompts.jsonl", "w") as out:
    for split in ("train", "heldout"):
        for line in open(f"{D}/sharegpt-{split}.jsonl"):
            row = json.loads(line)
            n = len(tok.apply_chat_template(
                prompt_messages(row), add_generation_prompt=True, return_dict=True
            )["input_ids"])
            if n > 1536:
                dropped[split] = dropped.get(split, 0) + 1
                continue
            kept[split] = kept.get(split, 0) + 1
            for _ in range(int(os.environ["REGEN_SAMPLES"]) if split == "train" else 1):
                out.write(json.dumps({**row, "split": split}) + "\n")
print(f"prompts kept {kept}, dropped as longer than 1536 tokens {dropped}")
PY
python3 -m train.regenerate --target artifacts/smollm2-135m-instruct --data $D/prompts.jsonl \
  --out $D/all.regen.jsonl --backend "$BACKEND" ${REGEN_MAX_ROWS:+--max-rows $REGEN_MAX_ROWS} --temperature 0.7 --top-p 0.8 --max-new-tokens 512 \
  --batch-size 4096 ${REGEN_CUDA_GRAPHS:+--vllm-cuda-graphs --vllm-max-num-seqs 1024} \
  2>&1 | grep -v "it/s\]"
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
