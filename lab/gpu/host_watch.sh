#!/usr/bin/env bash
# A GPU host's memory, disk and processes every INTERVAL seconds into LOG, so that a machine lost
# in the middle of a run (given back as "stopped answering", twice while vLLM 0.34 started a
# 1.5B-shaped engine on 2026-12-07) leaves what led up to it in the last poll that came back.
#   setsid nohup bash lab/gpu/host_watch.sh LOG [INTERVAL] >/dev/null 2>&1 </dev/null &
LOG="${1:?usage: host_watch.sh LOG [INTERVAL]}" INTERVAL="${2:-2}"
while true; do
  {
    echo "== $(date +%T)"
    free -m | sed -n 2,3p
    df -m /tmp | tail -1
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
    ps -eo rss,pcpu,comm --sort=-rss | sed -n 2,6p
  } >>"$LOG" 2>&1
  sleep "$INTERVAL"
done
