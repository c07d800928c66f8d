"""``fairgate bench engine-model``: how closely the simulated engine, fitted to a vLLM engine's measured
profile, predicts that engine's own throughput: the check behind every simulated figure.

vLLM runs on this machine (the project's tiny model, on the CPU); each trial measures its step-time
profile, replays a workload straight into it (``fairgate.loadgen.engine_replay``), measures the profile
again, and simulates the same workload with the simulated engine fitted to the two profiles' mean
(the machine drifts within minutes: the engine is measured on both sides of its run). Two workloads:
``mixed`` (two tenants overloading it with mixed lengths) and ``kv-bound`` (as many requests as its
batch limit whose outputs outgrow its pool: vLLM admits by the prompt and preempts the newest, and the
simulated engine is given the same rule and vLLM's watermark). Reported per trial and as the median
ratio, simulated over real.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from fairgate.core.registry import Param
from fairgate.loadgen.benches.base import Bench, Figures, Options, names, register
from fairgate.loadgen.engine_replay import replay_into_runner
from fairgate.loadgen.simulator import SimulationConfig, simulate
from fairgate.loadgen.workload import Workload
from fairgate.loadgen.workloads import Phase, TenantSpec, generate
from fairgate.workers.engines.interface import EngineRunner, StepReport
from fairgate.workers.engines.simulated import StepTimeModel

WORKLOADS = ("mixed", "kv-bound")
KV_TOKENS, BLOCK, MAX_NUM_SEQS = 4096, 32, 16
GRIDS = {
    "mixed": {"inputs": (16, 64, 160), "outputs": (1, 32, 96)},
    "kv-bound": {"inputs": (16, 96, 256), "outputs": (1, 64, 192)},
}

Run = Callable[[Coroutine[Any, Any, Any]], Any]  # runs a coroutine on the engine's loop


def workload(kind: str, seconds: float) -> Workload:
    """``mixed``: prompts 32 or 16, outputs 160 or 96, at 15 and 30 requests/s; ``kv-bound``: prompts and
    outputs of 160 and 256, at 10 and 20 requests/s, more than the engine finishes at any speed this
    machine runs it, so it holds its batch limit throughout: 16 at once need 5,100-8,200 tokens of a
    4,096-token pool. (At 4 and 8 requests/s a fast run held fewer at once, and its pool was enough.)"""
    if kind == "mixed":
        lengths, rates, seed = ((32, 160), (16, 96)), (15.0, 30.0), 3
    else:
        lengths, rates, seed = ((160, 256), (160, 256)), (10.0, 20.0), 5
    specs = [
        TenantSpec(name, (Phase(0.0, seconds, rate, arrival="poisson"),), *lengths)
        for name, rate in zip("AB", rates, strict=True)
    ]
    return generate(f"engine-model-{kind}", seconds, specs, seed=seed)


@dataclass
class Trial:
    real: float  # vLLM's output tokens/s
    simulated: float  # the fitted simulated engine's
    waited: int  # most requests vLLM held waiting while it held no more than its batch limit


async def _settle(runner: EngineRunner) -> None:
    """Let the last step's report go out."""
    for _ in range(50):
        await asyncio.sleep(0.02)
        if not runner.has_work():
            await asyncio.sleep(0.05)
            return


def compare(run: Run, runner: Any, reports: list[StepReport], kind: str, seconds: float, trials: int) -> list[Trial]:
    """``trials`` of ``kind`` on a started vLLM runner (``reports``: the list its steps are reported to)."""
    from fairgate.workers.engines.vllm.local_models import SPECIAL_TOKENS, VOCAB_SIZE
    from fairgate.workers.engines.vllm.profiler import average_profiles, profile

    load, grid = workload(kind, seconds), GRIDS[kind]
    # the KV-bound case: the simulated engine admits and preempts by vLLM's rule, above its watermark
    rule = {"preempt_by": "newest", "watermark": runner.watermark_tokens / KV_TOKENS} if kind == "kv-bound" else {}
    before = run(profile(runner, **grid))
    out = []
    for trial in range(trials):
        reports.clear()
        vocabulary = range(len(SPECIAL_TOKENS), VOCAB_SIZE)
        real = run(replay_into_runner(runner, load, vocabulary, seed=10 * WORKLOADS.index(kind) + trial))
        run(_settle(runner))
        waited = max((r.waiting for r in reports if r.running + r.waiting <= MAX_NUM_SEQS), default=0)
        after = run(profile(runner, **grid))
        config = SimulationConfig(
            kv_tokens=KV_TOKENS,
            step_model=StepTimeModel.from_profile(average_profiles(before, after)),
            block_size=BLOCK,
            max_running=MAX_NUM_SEQS,
            **rule,
        )
        simulated = simulate(load, config).report["output_tokens"] / load.duration_s
        out.append(Trial(real, simulated, waited))
        before = after
    return out


@register
class EngineModelBench(Bench):
    """The simulated engine fitted to a vLLM engine's measured profile against that engine's own
    throughput (vLLM on the CPU, the tiny model), on a mixed and a KV-bound workload."""

    name = "engine-model"
    help = "the simulated engine, fitted to vLLM's measured profile, against vLLM's own throughput"
    params = (
        Param("workloads", str, ",".join(WORKLOADS), "comma-separated: " + ", ".join(WORKLOADS)),
        Param("seconds", float, 15.0, "of each workload's replay"),
        Param("trials", int, 3, "replays of each workload, each between two profiles (medians)"),
    )

    def check(self, options: Options) -> None:
        names(options["workloads"], "--workloads", WORKLOADS)
        if options["seconds"] <= 0 or options["trials"] < 1:
            raise ValueError("--seconds and --trials must be positive")

    def run(self, options: Options) -> Figures:
        from fairgate.workers.engines.vllm.runner import VllmRunner
        from fairgate.workers.engines.vllm.settings import VllmSettings

        loop = asyncio.new_event_loop()
        settings = VllmSettings(model="tiny", kv_tokens=KV_TOKENS, block_size=BLOCK, max_num_seqs=MAX_NUM_SEQS)
        runner, reports = VllmRunner(settings), list[StepReport]()
        loop.run_until_complete(runner.start(reports.append))
        try:
            figures: Figures = {"seconds": options["seconds"], "workloads": {}}
            for kind in names(options["workloads"], "--workloads", WORKLOADS):
                trials = compare(loop.run_until_complete, runner, reports, kind, options["seconds"], options["trials"])
                figures["workloads"][kind] = {
                    "trials": [vars(t) for t in trials],
                    "median_ratio": statistics.median(t.simulated / t.real for t in trials if t.real),
                }
            return figures
        finally:
            loop.run_until_complete(runner.stop())
            loop.close()

    def report(self, figures: Figures) -> str:
        out = [
            f"vLLM on the CPU (tiny model, {KV_TOKENS:,}-token pool, batch limit {MAX_NUM_SEQS}), "
            f"{figures['seconds']:g} s replays, each between two profiles: output tokens/s",
            f"{'workload':<10} {'trial':>5} {'vLLM':>8} {'simulated':>10} {'ratio':>6} {'waited':>7}",
        ]
        for kind, w in figures["workloads"].items():
            for i, t in enumerate(w["trials"]):
                ratio = t["simulated"] / t["real"] if t["real"] else float("nan")
                out.append(
                    f"{kind:<10} {i:>5} {t['real']:>8.0f} {t['simulated']:>10.0f} {ratio:>6.2f} {t['waited']:>7}"
                )
            out.append(f"{kind}: the simulated engine at {w['median_ratio']:.2f}x vLLM's throughput (median)")
        return "\n".join(out)
