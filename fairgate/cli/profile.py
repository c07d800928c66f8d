"""``fairgate profile``: measure an engine's prefill and decode times by length into a cost profile
(the format of ``loadgen/data/a10g_llama7b_cost_profile.json``, the VTC paper's A10G profile)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fairgate.cli.parsing import UsageError, positive_ints


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    prof = sub.add_parser("profile", help="measure an engine's prefill/decode times into a cost profile")
    prof.add_argument("--engine", choices=("vllm",), default="vllm")
    prof.add_argument("--model", default="tiny", help="vLLM model (default: the project's tiny model)")
    prof.add_argument("--kv-tokens", type=int, help="KV pool in tokens (default: vLLM's sizing; 8192 on CPU)")
    prof.add_argument("--max-num-seqs", type=int, help="vLLM's batch limit")
    prof.add_argument("--inputs", default="8,64,256,512", help="comma-separated prompt lengths")
    prof.add_argument("--outputs", default="1,64,128,256", help="comma-separated output lengths")
    prof.add_argument("--out", type=Path, default=Path("out/profile.json"))
    return prof


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from fairgate.workers.engines.vllm.profiler import profile
    from fairgate.workers.engines.vllm.runner import VllmRunner
    from fairgate.workers.engines.vllm.settings import VllmSettings

    inputs = positive_ints(args.inputs, "--inputs")
    outputs = positive_ints(args.outputs, "--outputs")
    try:
        settings = VllmSettings.from_dict(
            {"model": args.model, "kv_tokens": args.kv_tokens, "max_num_seqs": args.max_num_seqs}
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    async def measure() -> dict:
        runner = VllmRunner(settings)
        await runner.start(lambda _report: None)
        try:
            print(
                f"engine up: {runner.kv_tokens} KV tokens, blocks of {runner.block_size}, batch <= {runner.max_running}"
            )
            return await profile(runner, inputs, outputs, progress=print)
        finally:
            await runner.stop()

    result = asyncio.run(measure())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0
