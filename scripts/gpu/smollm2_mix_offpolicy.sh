#!/usr/bin/env bash
# SmolLM2, between regeneration and training: the train rows the target answered itself
# (train.regen.jsonl) plus ShareGPT's own answers to the same prompts (sharegpt-train.jsonl,
# off-policy) as one file, train.mix.jsonl. The distillation targets are the target's logits in
# either case; the off-policy half only changes the contexts, and keeps a draft trained on twice
# the tokens from passing over too few answers (a regeneration cut by its time budget leaves
# fewer than one answer per prompt). Beside it, train.mix.jsonl.summary.json: the regeneration's
# summary (train.distill records it as provenance) with what was mixed in.
set -euo pipefail; cd "$(dirname "$0")/../.."
D=artifacts/smollm2-data
cat $D/train.regen.jsonl $D/sharegpt-train.jsonl >$D/train.mix.jsonl
python3 - "$D" <<'PY'
import json, sys
d = sys.argv[1]
count = lambda f: sum(1 for _ in open(f"{d}/{f}"))
summary = json.load(open(f"{d}/train.regen.jsonl.summary.json"))
summary["mixed_with"] = {
    "file": f"{d}/sharegpt-train.jsonl",
    "rows": count("sharegpt-train.jsonl"),
    "answers": "ShareGPT's own (off-policy)",
    "rows_regenerated": count("train.regen.jsonl"),
}
json.dump(summary, open(f"{d}/train.mix.jsonl.summary.json", "w"), indent=2)
print(json.dumps(summary["mixed_with"]))
PY
wc -l $D/train.mix.jsonl
