"""``max_tokens`` abuse: a tenant whose requests ask for the whole context and stop at once, against an
honest one, through fairgate and, for comparison, straight into the engine (round robin). Admission is
by the engine's own rule, so nothing is held for output a request never generates: the greedy tenant
gets what it uses and no more, inside the bound. One simulated A10G engine (10,000-token pool, the
paper's step model)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from fairgate.core import make_policy
from fairgate.core.registry import Param
from fairgate.loadgen.benches.base import Bench, Figures, Options, register
from fairgate.loadgen.benches.shared import service_row
from fairgate.loadgen.simulator import SimulationConfig, simulate
from fairgate.loadgen.workload import TraceRequest, Workload

GREEDY_MAX_TOKENS = 4000  # near the 4,096-token context of the paper's Llama-7B


def abuse_workload(seconds: float, seed: int) -> Workload:
    """``honest``: 256-token prompts generating 256 tokens, 4 req/s (over the engine's ~1.7 req/s);
    ``greedy``: 8-token prompts with ``max_tokens`` 4,000 that stop after 4 tokens, 20 req/s."""
    rng = np.random.default_rng(seed)
    requests = [TraceRequest("honest", float(t), 256, 256) for t in np.sort(rng.uniform(0, seconds, int(4 * seconds)))]
    requests += [
        TraceRequest("greedy", float(t), 8, 4, GREEDY_MAX_TOKENS)
        for t in np.sort(rng.uniform(0, seconds, int(20 * seconds)))
    ]
    requests.sort(key=lambda r: (r.arrival_s, r.tenant))
    return Workload("reservation-abuse", seconds, requests, {"honest": 1.0, "greedy": 1.0})


def bench_reservation(seconds: float = 300.0, seed: int = 0, policy: str = "vtc") -> list[dict[str, Any]]:
    """One row per front (fairgate, round-robin): throughput, each tenant's service and share, the
    largest gap of backlogged service against the bound."""
    workload = abuse_workload(seconds, seed)
    base = SimulationConfig(policy=policy, seed=seed)
    rows = []
    for front in ("fairgate", "round-robin"):
        report = simulate(workload, replace(base, front=front)).report
        rows.append({"front": front, **service_row(report, seconds)})
    return rows


@register
class ReservationBench(Bench):
    """max_tokens abuse: a greedy tenant against an honest one, fairgate against round robin."""

    name = "reservation"
    help = "max_tokens abuse: a greedy tenant against an honest one"
    params = (
        Param("seconds", float, 300.0, "simulated seconds of overload"),
        Param("policy", str, "vtc", "fairness policy of both runs"),
    )

    def check(self, options: Options) -> None:
        if options["seconds"] <= 0:
            raise ValueError("--seconds must be positive")
        make_policy(options["policy"])

    def run(self, options: Options) -> Figures:
        rows = bench_reservation(options["seconds"], policy=options["policy"])
        return {"seconds": options["seconds"], "rows": rows}

    def report(self, figures: Figures) -> str:
        out = [
            f"max_tokens abuse, {figures['seconds']:.0f} simulated s on one A10G engine (10,000 KV tokens): "
            f"'greedy' sends 8-token prompts with max_tokens {GREEDY_MAX_TOKENS:,} that stop after 4 tokens; "
            "'honest' 256 in / 256 out",
            f"{'front':>12}  {'tokens/s':>9}  {'honest/s':>9}  {'greedy/s':>9}  {'honest':>7}  {'greedy':>7}  "
            "gap / bound",
        ]
        for r in figures["rows"]:
            rate, share = r["service_per_s"], r["share"]
            out.append(
                f"{r['front']:>12}  {r['throughput_tokens_per_s']:>9.0f}  "
                f"{rate['honest']:>9.0f}  {rate['greedy']:>9.0f}  "
                f"{share['honest']:>7.1%}  {share['greedy']:>7.1%}  {r['max_backlogged_gap']:,.0f} / {r['bound']:,.0f}"
                f"{'' if r['bound_held'] else '  (over the bound)'}"
            )
        return "\n".join(out)
