#!/usr/bin/env bash
# Watch run_all.sh for up to $1 seconds (default 540; returns early when it is DONE), then pack
# its results (logs, JSON, small files; no weights) into $OUT/results.tgz and print the stages.
RES="${RES:-/tmp/dspark-res}"; OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
end=$((SECONDS + ${1:-540}))
while [ ! -f "$RES/DONE" ] && [ $SECONDS -lt $end ]; do sleep 5; done
cat "$RES/stages.txt" 2>/dev/null
for f in "$RES"/*.log; do [ -f "$f" ] && { echo "== $f"; tail -c 1500 "$f"; }; done
tar -czf "$OUT/results.tgz" -C "$RES" --exclude='*.safetensors' . 2>/dev/null
ls -la "$OUT"
