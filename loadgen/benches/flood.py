"""A KV-bound flood, side by side: fairgate's dispatcher against a fairness-blind round-robin front on the
same simulated engines (issue 28's case). Two closed-loop tenants keep 32 and 8 requests outstanding
(``--outstanding``; prompts of about 400 tokens, 300 output tokens each), on one and on four A10G
engines (10,000-token KV pools, the paper's step model), in virtual time. With 96 and 24 both keep
more outstanding than one engine runs at once (about 18).

Arms: ``round-robin`` (each request straight to the next engine, which admits and preempts by its own
rule: vLLM's, newest first), and fairgate with VTC, its engines preempting the newest (vLLM's default)
or by the dispatcher's ranks (``preempt_by="priority"``), without revocation, and the deployment's
default (ranks, revocation on). Figures per arm: tokens/s (prompt and output), the light tenant's
service over the heavy one's,
each tenant's service rate and share, the largest backlogged gap against the stated bound,
preemptions, and the light tenant's first-token time (mean, p50, p99).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fairgate.core import SchedulerConfig
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
    revoke: bool = False


ARMS = (
    Arm("round-robin", "round-robin"),
    Arm("fairgate (engine preempts newest)", "fairgate"),
    Arm("fairgate (preempts by rank)", "fairgate", "priority"),
    Arm("fairgate (default: ranks, revoke)", "fairgate", "priority", SchedulerConfig().revoke),
)


def flood_workload(seconds: float, seed: int, outstanding: dict[str, int] | None = None) -> Workload:
    """Each tenant's closed loops start at once; the simulator sends a copy of each request as it ends."""
    loops = dict(outstanding or OUTSTANDING)
    rng = np.random.default_rng(seed)
    requests = [
        TraceRequest(tenant, 0.0, int(rng.integers(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1)), OUTPUT_TOKENS)
        for tenant, n in loops.items()
        for _ in range(n)
    ]
    return Workload("flood", seconds, requests, {HEAVY: 1.0, LIGHT: 1.0}, outstanding=loops)


def bench_flood(
    seconds: float = 300.0,
    replicas: tuple[int, ...] = (1, 4),
    seed: int = 0,
    outstanding: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """One row per engine count and arm."""
    rows = []
    for n in replicas:
        for arm in ARMS:
            config = SimulationConfig(
                policy="vtc", replicas=n, front=arm.front, preempt_by=arm.preempt_by, revoke=arm.revoke, seed=seed
            )
            sim = Simulation(flood_workload(seconds, seed, outstanding), config)
            report = sim.run().report
            tenants = report["tenants"]
            row = service_row(report, seconds)
            rows.append(
                {
                    "replicas": n,
                    "arm": arm.name,
                    **row,
                    "light_over_heavy": row["share"][LIGHT] / max(row["share"][HEAVY], 1e-9),
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
        Param("outstanding", str, "32,8", "requests the heavy and the light tenant keep outstanding"),
    )

    def check(self, options: Options) -> None:
        if options["seconds"] <= 0:
            raise ValueError("--seconds must be positive")
        numbers(options["replicas"], "--replicas")
        _loops(options["outstanding"])

    def run(self, options: Options) -> Figures:
        loops = _loops(options["outstanding"])
        rows = bench_flood(options["seconds"], numbers(options["replicas"], "--replicas"), outstanding=loops)
        ratios = ratio_to_round_robin(rows)
        for r in rows:
            r["vs_round_robin"] = ratios[(r["replicas"], r["arm"])]
        return {"seconds": options["seconds"], "tenant_light": LIGHT, "outstanding": loops, "rows": rows}

    def report(self, figures: Figures) -> str:
        loops = ", ".join(f"{t} {n}" for t, n in figures["outstanding"].items())
        out = [
            f"KV-bound flood, {figures['seconds']:.0f} simulated s; closed loops: {loops} outstanding; "
            "~400 in / 300 out",
            f"{'engines':>7}  {'arm':<34} {'tokens/s':>9} {'vs RR':>6}  {'shares (heavy/light)':>20}  "
            f"{'light/heavy':>11}  "
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
                f"  {share:>20}  {r['light_over_heavy']:>11.2f}  {gap:>7} / {r['bound']:>7,.0f}  {r['preemptions']:>7}"
                f"  {ttft} s"
                f"{'' if r['bound_held'] else '  (over the bound)'}"
            )
        return "\n".join(out)


def _loops(text: str) -> dict[str, int]:
    """``--outstanding``: the heavy and the light tenant's closed loops."""
    counts = numbers(text, "--outstanding")
    if len(counts) != 2:
        raise ValueError("--outstanding takes two counts: the heavy tenant's and the light one's")
    return {HEAVY: counts[0], LIGHT: counts[1]}
