#!/usr/bin/env bash
# SmolLM2, between regeneration and training: train rows from several sources as one file,
# artifacts/smollm2-data/train.mix.jsonl, for smollm2_dspark_16k.
#   bash lab/gpu/smollm2_mix.sh [--read N] [FILE...]     (files under artifacts/smollm2-data)
# Default: train.regen.jsonl (the target's own answers) and sharegpt-train.jsonl (ShareGPT's
# answers to the same prompts, off-policy). The distillation targets are the target's logits in
# every case; the sources only change the contexts, e.g. train.greedy.jsonl (the target's greedy
# answers, the contexts a greedily served draft meets) beside train.regen.jsonl (T=0.7), or
# ShareGPT's own, which keep a draft trained on many tokens from passing over too few answers.
# Beside it, train.mix.jsonl.summary.json (train.distill records it as provenance): the first
# source's summary (the regeneration's, if it has one) and every source's file, rows and summary.
# A source with no rows (a regeneration whose time budget ended before its first train answer) is
# left out and named, so the draft still trains on the others; with none left it fails.
# --read N: also sharegpt-read.jsonl, the first N prompts of sharegpt-train.jsonl whose rows the
# mix holds (a prompt set whose answers the drafts read, for smollm2_evaluate.sh --domain; a
# ShareGPT prompt the regeneration left out is skipped, so none of them is unread).
set -euo pipefail; cd "$(dirname "$0")/../.."
D="${SMOLLM2_DATA:-artifacts/smollm2-data}" READ="" ASKED=()
while [ $# -gt 0 ]; do
  case "$1" in
    --read) READ=$2; shift 2 ;;
    *) ASKED+=("$1"); shift ;;
  esac
done
[ ${#ASKED[@]} -gt 0 ] || ASKED=(train.regen.jsonl sharegpt-train.jsonl)
SOURCES=()
for f in "${ASKED[@]}"; do
  if [ -s "$D/$f" ]; then SOURCES+=("$f"); else echo "smollm2_mix.sh: no rows in $D/$f, left out" >&2; fi
done
[ ${#SOURCES[@]} -gt 0 ] || { echo "smollm2_mix.sh: none of ${ASKED[*]} has rows" >&2; exit 2; }
(cd $D && cat "${SOURCES[@]}") >$D/train.mix.jsonl
python3 - "$D" "${SOURCES[@]}" <<'PY'
import json, os, sys
d, sources = sys.argv[1], sys.argv[2:]
def source(name):
    path = f"{d}/{name}"
    s = {"file": path, "rows": sum(1 for _ in open(path))}
    if os.path.exists(path + ".summary.json"):
        s["summary"] = json.load(open(path + ".summary.json"))
    else:
        s["answers"] = "the dataset's own (off-policy)"
    return s
parts = [source(n) for n in sources]
summary = {**parts[0].get("summary", {}), "mixed_from": parts}
json.dump(summary, open(f"{d}/train.mix.jsonl.summary.json", "w"), indent=2)
print(json.dumps([{k: p[k] for k in ("file", "rows")} for p in parts]))
PY
wc -l $D/train.mix.jsonl
[ -z "$READ" ] || python3 - "$D" "$READ" <<'PY'
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
read = {json.loads(line)["id"] for line in open(f"{d}/train.mix.jsonl")}
kept, skipped = [], 0
for line in open(f"{d}/sharegpt-train.jsonl"):
    if len(kept) == n:
        break
    if json.loads(line)["id"] in read:
        kept.append(line)
    else:
        skipped += 1
open(f"{d}/sharegpt-read.jsonl", "w").writelines(kept)
print(f"{d}/sharegpt-read.jsonl: {len(kept)} prompts the drafts read ({skipped} unread skipped)")
PY
