"""The bound with engines filled as they fill themselves: requests in flight may be expected to reach
``overcommit`` pools, and a tenant admitted while it was the least served can be charged all of their
output afterwards. A flood of long outputs beside short requests (virtual time, one 10,000-token
engine) shows both halves: the gap stays inside the stated bound, whose M is the over-commit's reach,
and over-commit beyond one pool takes it past the bound that counts one pool only (so that term is
needed, not decoration)."""

from __future__ import annotations

import pytest

from fairgate.core import LinearCost
from fairgate.core.fairness import engine_queue_slack, two_u
from fairgate.loadgen.simulator import Simulation, SimulationConfig
from fairgate.loadgen.workload_spec import workload_from_spec

KV = 10_000
FLOOD = {
    "duration_s": 600,
    "kv_tokens": KV,
    "tenants": [
        {"name": "short", "rate": 4.0, "prompt_len": 256, "output_len": 256},
        {"name": "long", "rate": 2.0, "prompt_len": 16, "output_len": 1500},
    ],
}


def _run(overcommit: float, preempt_by: str = "newest") -> dict:
    workload = workload_from_spec(FLOOD, seed=42)
    sim = Simulation(workload, SimulationConfig(kv_tokens=KV, overcommit=overcommit, preempt_by=preempt_by))
    sim.advance(workload.duration_s)
    return sim.summary().report


@pytest.fixture(scope="module")
def runs():
    return {(oc, by): _run(oc, by) for oc in (1.0, 2.0, 3.0) for by in ("newest", "priority")}


def test_the_gap_stays_inside_the_bound_stated_for_the_overcommit(runs):
    queues = engine_queue_slack(LinearCost(), 256, 8)
    one_pool = two_u(LinearCost(), 256, 1500, KV) + queues
    for (overcommit, by), r in runs.items():
        assert r["bound_held"] and r["max_abs_service_diff"] <= r["bound_2u"], (overcommit, by)
        assert r["bound_2u"] == two_u(LinearCost(), 256, 1500, round(KV * overcommit)) + queues
    for by in ("newest", "priority"):  # beyond one pool in flight, the one-pool bound does not hold
        assert runs[(1.0, by)]["max_abs_service_diff"] <= one_pool
        assert runs[(3.0, by)]["max_abs_service_diff"] > one_pool


def test_overcommit_is_worth_its_larger_bound(runs):
    for by in ("newest", "priority"):
        assert runs[(2.0, by)]["throughput_tokens_per_s"] > 1.1 * runs[(1.0, by)]["throughput_tokens_per_s"]
