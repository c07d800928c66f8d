#!/usr/bin/env bash
# Start the fairgate gateway with its embedded defaults: local Ray on loopback, simulated workers,
# in-memory state, http://127.0.0.1:8000/v1. Extra arguments go to `fairgate` (default: `serve`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -eq 0 ]; then
  set -- serve
fi
exec .venv/bin/fairgate "$@"
