"""A KV-bound flood, side by side: fairgate's dispatcher against a fairness-blind round-robin front on the
same simulated engines (issue 28's case). Two closed-loop tenants keep 32 and 8 requests outstanding
(prompts of about 400 tokens, 300 output tokens each), on one and on four A10G engines (10,000-token
KV pools, the paper's step model), in virtual time.

Arms: ``round-robin`` (each request straight to the next engine, which admits and preempts by its own
rule: vLLM's, newest first), and fairgate with VTC, its engines preempting the newest (their default)
or by the dispatcher's ranks (``preempt_by="priority"``). Figures per arm: tokens/s (prompt and output),
each tenant's service rate and share, the largest backlogged gap against the stated bound,
preemptions, and the light tenant's first-token time (mean, p50, p99).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fairgate.core.registry import Param
from fairgate.loadgen.benches.base import Bench, Figures, Options, numbers, register
from fairgate.loadgen.benches.shared import service_row
from fairgate.loadgen.simulator import Simulation, SimulationConfig
from fairgate.loadgen.workload import TraceRequest, Workload

HEAVY, LIGHT = "heavy", "light"
OUTSTANDING = {HEAVY: 32, LIGHT: 8}
PROMPT_TOKENS = (380, 420)
OUTPUT_TOKENS = 300


@dataclass(frozen=True)
class Arm:
    name: str
    front: str
    preempt_by: str = "newest"


ARMS = (
    Arm("round-robin", "round-robin"),
    Arm("fairgate (engine preempts newest)", "fairgate"),
    Arm("fairgate (preempts by rank)", "fairgate", "priority"),
)


def flood_workload(seconds: float, seed: int) -> Workload:
    """Each tenant's closed loops start at once; the simulator sends a copy of each request as it ends."""
    rng = np.random.default_rng(seed)
    requests = [
        TraceRequest(tenant, 0.0, int(rng.integers(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1)), OUTPUT_TOKENS)
        for tenant, n in OUTSTANDING.items()
        for _ in range(n)
    ]
    return Workload("flood", seconds, requests, {HEAVY: 1.0, LIGHT: 1.0}, outstanding=dict(OUTSTANDING))


def bench_flood(seconds: float = 300.0, replicas: tuple[int, ...] = (1, 4), seed: int = 0) -> list[dict[str, Any]]:
    """One row per engine count and arm."""
    rows = []
    for n in replicas:
        for arm in ARMS:
            config = SimulationConfig(policy="vtc", replicas=n, front=arm.front, preempt_by=arm.preempt_by, seed=seed)
            sim = Simulation(flood_workload(seconds, seed), config)
            report = sim.run().report
            tenants = report["tenants"]
            rows.append(
                {
                    "replicas": n,
                    "arm": arm.name,
                    **service_row(report, seconds),
                    "preemptions": sum(e.preemptions for e in sim.engines),
                    "light_mean_ttft_s": tenants[LIGHT]["mean_ttft_s"],
                    "light_p50_ttft_s": tenants[LIGHT]["p50_ttft_s"],
                    "light_p99_ttft_s": tenants[LIGHT]["p99_ttft_s"],
                    "heavy_mean_ttft_s": tenants[HEAVY]["mean_ttft_s"],
                }
            )
    return rows


def ratio_to_round_robin(rows: list[dict[str, Any]]) -> dict[tuple[int, str], float]:
    """Each arm's tokens/s over the round-robin arm's on as many engines."""
    base = {r["replicas"]: r["throughput_tokens_per_s"] for r in rows if r["arm"] == ARMS[0].name}
    return {(r["replicas"], r["arm"]): r["throughput_tokens_per_s"] / max(base[r["replicas"]], 1e-9) for r in rows}


@register
class FloodBench(Bench):
    """A KV-bound flood: fairgate against a round-robin front on the same simulated engines."""

    name = "flood"
    help = "KV-bound flood: fairgate against a round-robin front, same engines"
    params = (
        Param("seconds", float, 300.0, "simulated seconds of each run"),
        Param("replicas", str, "1,4", "comma-separated engine counts"),
    )

    def check(self, options: Options) -> None:
        if options["seconds"] <= 0:
            raise ValueError("--seconds must be positive")
        numbers(options["replicas"], "--replicas")

    def run(self, options: Options) -> Figures:
        rows = bench_flood(options["seconds"], numbers(options["replicas"], "--replicas"))
        ratios = ratio_to_round_robin(rows)
        for r in rows:
            r["vs_round_robin"] = ratios[(r["replicas"], r["arm"])]
        return {"seconds": options["seconds"], "tenant_light": LIGHT, "rows": rows}

    def report(self, figures: Figures) -> str:
        loops = ", ".join(f"{t} {n}" for t, n in OUTSTANDING.items())
        out = [
            f"KV-bound flood, {figures['seconds']:.0f} simulated s; closed loops: {loops} outstanding; "
            "~400 in / 300 out",
            f"{'engines':>7}  {'arm':<34} {'tokens/s':>9} {'vs RR':>6}  {'shares (heavy/light)':>20}  "
            f"{'gap / bound':>17}  {'preempt':>7}  light TTFT mean, p50, p99",
        ]
        for r in figures["rows"]:
            share = "/".join(f"{v:.0%}" for v in r["share"].values())
            gap = "-" if r["arm"] == ARMS[0].name else f"{r['max_backlogged_gap']:,.0f}"  # no queue to be backlogged in
            ttft = ", ".join(
                "-" if r[k] is None else f"{r[k]:.2f}"
                for k in ("light_mean_ttft_s", "light_p50_ttft_s", "light_p99_ttft_s")
            )
            out.append(
                f"{r['replicas']:>7}  {r['arm']:<34} {r['throughput_tokens_per_s']:>9.0f}"
                f" {r['vs_round_robin']:>5.2f}x"
                f"  {share:>20}  {gap:>7} / {r['bound']:>7,.0f}  {r['preemptions']:>7}"
                f"  {ttft} s"
                f"{'' if r['bound_held'] else '  (over the bound)'}"
            )
        return "\n".join(out)
