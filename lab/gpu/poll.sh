#!/usr/bin/env bash
# Watch run_all.sh for up to $1 seconds (default 540; returns early when it is DONE, and at once, with
# exit code 3, when no pipeline runs on this machine), then return what
# has finished so far: $OUT/results.tgz (logs, JSON, small files; no weights, no ship/) and the next
# parts of $RES/ship not yet returned (< 16 MB each), as many as the device tool returns from one
# call: 8 files and 64 MiB in all, results.tgz and SHA256SUMS included (four 15 MB parts a poll;
# on 2026-12-04, at three a poll, two of a draft's five parts were lost with the machine).
#   bash lab/gpu/poll.sh [--resend] [SECONDS]
# --resend: the parts the previous poll returned are returned again. The device tool can fail to
# copy a call's files back ("none could be copied onto this machine this time", 2026-12-05
# evening: a whole draft's five parts); the machine had marked them sent, so no later poll would
# have brought them.
RESEND=0; [ "${1:-}" = --resend ] && { RESEND=1; shift; }
RES="${RES:-/tmp/dspark-res}"; OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
end=$((SECONDS + ${1:-540}))
# A deadline (epoch seconds) written by the session's first call, e.g.
#   echo $(( $(date +%s) + 1560 )) >/tmp/dspark-deadline
# ends every poll in time to return its files before the device budget runs out.
DEADLINE="${DEADLINE_FILE:-/tmp/dspark-deadline}"
if [ -f "$DEADLINE" ]; then
  left=$(( $(cat "$DEADLINE") - $(date +%s) )); [ $left -lt 0 ] && left=0
  [ $((SECONDS + left)) -lt $end ] && end=$((SECONDS + left))
fi
# A poll waits only while a pipeline runs. On 2026-12-05 the call that starts the pipeline got no
# machine, the next call got a fresh one, and three polls waited 23 minutes of device time for a
# pipeline that never started: now such a poll returns at once and says so.
running() { [ -f "$RES/pipeline.pid" ] && kill -0 "$(cat "$RES/pipeline.pid")" 2>/dev/null; }
while [ ! -f "$RES/DONE" ] && running && [ $SECONDS -lt $end ]; do sleep 5; done
rc=0
if [ ! -f "$RES/DONE" ] && ! running; then
  rc=3
  if [ -f "$RES/pipeline.pid" ]; then echo "poll: the pipeline stopped before DONE (killed?)"
  else echo "poll: no pipeline was started on this machine (the call that starts it ran elsewhere or failed)"; fi
fi
cat "$RES/stages.txt" "$RES"/*/stages.txt 2>/dev/null  # the pipeline, then its branches
for f in "$RES"/*.log "$RES"/*/*.log; do [ -f "$f" ] && { echo "== $f"; tail -c 1200 "$f"; }; done
tar -czf "$OUT/results.tgz" -C "$RES" --exclude='*.safetensors' --exclude=./ship . 2>/dev/null
if [ -d "$RES/ship" ]; then
  # SHA256SUMS every time: a later pack (the draft after the answers) rewrites it.
  [ -f "$RES/ship/SHA256SUMS" ] && cp "$RES/ship/SHA256SUMS" "$OUT/"
  sent="$RES/ship/.sent" last="$RES/ship/.last"; touch "$sent" "$last"
  if [ $RESEND = 1 ]; then grep -vxFf "$last" "$sent" >"$sent.new"; mv "$sent.new" "$sent"; fi
  fresh=1; n=$(find "$OUT" -type f | wc -l) room=$((64 * 1024 * 1024 - 65536))
  for f in "$OUT"/*; do [ -f "$f" ] && room=$((room - $(stat -c %s "$f"))); done
  for f in "$RES"/ship/*; do
    b=$(basename "$f"); [ "$b" = SHA256SUMS ] && continue; grep -qxF "$b" "$sent" && continue
    size=$(stat -c %s "$f"); [ $n -lt 8 ] && [ "$size" -le "$room" ] || break
    cp "$f" "$OUT/"; echo "$b" >>"$sent"
    [ $fresh = 1 ] && { : >"$last"; fresh=0; }; echo "$b" >>"$last"  # a poll with none keeps it
    n=$((n + 1)); room=$((room - size))
  done
fi
ls -la "$OUT"
exit $rc
