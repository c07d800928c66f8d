"""``max_tokens`` abuse: a tenant whose requests ask for the whole context and stop at once, against an
honest one, through fairgate and, for comparison, straight into the engine (round robin). Admission is
by the engine's own rule, so nothing is held for output a request never generates: the greedy tenant
gets what it uses and no more, inside the bound. One simulated A10G engine (10,000-token pool, the
paper's step model)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

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


def service_row(report: dict[str, Any], seconds: float) -> dict[str, Any]:
    """A run's figures for a side-by-side bench: tokens/s, each tenant's service rate and share, and
    the largest backlogged gap against the bound."""
    tenants = report["tenants"]
    total = sum(t["service"] for t in tenants.values()) or 1.0
    return {
        "throughput_tokens_per_s": report["throughput_tokens_per_s"],
        "service_per_s": {name: t["service"] / seconds for name, t in tenants.items()},
        "share": {name: t["service"] / total for name, t in tenants.items()},
        "max_backlogged_gap": report["max_abs_service_diff"],
        "bound": report["bound_2u"],
        "bound_held": report["bound_held"],
    }
