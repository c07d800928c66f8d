#!/usr/bin/env bash
# Start fairgate with its embedded defaults. Until the gateway lands this runs the paper's
# `overload` workload in the simulator under VTC and FCFS; extra arguments go to `fairgate`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -eq 0 ]; then
  set -- simulate --workload overload --policy vtc --policy fcfs --out out/overload
fi
exec .venv/bin/fairgate "$@"
