#!/usr/bin/env bash
# SmolLM2: serve with vLLM 0.26 the draft that realized the higher T=0 acceptance on ShareGPT in
# the engine's evaluation (smollm2_evaluate.sh's JSON), a rule fixed before the run instead of a
# choice made after it.
#   bash lab/gpu/smollm2_serve_best.sh EVAL_JSON NAME=DIR... -- [ROW...]
# EVAL_JSON: a path, or a name in $OUT (where smollm2_evaluate.sh wrote it).
set -euo pipefail; cd "$(dirname "$0")/../.."
JSON="$1"; shift; DRAFTS=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do DRAFTS+=("$1"); shift; done
[ $# -gt 0 ] && shift
[ -f "$JSON" ] || JSON="${OUT:-gpu-out}/$JSON"
[ -f "$JSON" ] || { echo "smollm2_serve_best.sh: no evaluation at $JSON" >&2; exit 2; }
BEST=$(python3 - "$JSON" "${DRAFTS[@]}" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
dirs = dict(a.split("=", 1) for a in sys.argv[2:])
tau = {r["draft"]: r["mean_acceptance_length"] for r in rows
       if r["temperature"] == 0.0 and r["domain"] == "sharegpt" and r["draft"] in dirs}
best = max(tau, key=tau.get)
print(f"serving {best}: T=0 ShareGPT tau " + ", ".join(f"{k} {v:.3f}" for k, v in tau.items()), file=sys.stderr)
print(dirs[best])
PY
)
exec bash lab/gpu/smollm2_serve.sh 0.26 "$BEST" "$@"
