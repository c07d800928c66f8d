"""Dispatcher shards on random and adversarial traces, through the real core and the real engine model
in virtual time: every backlogged pair inside the stated bound, a tenant pinned to one shard (skew)
and a shard lost and restarted from its durable state included; every request answered once, with its
whole output and no token more; and after a round every shard's view of each tenant is what the
engines served it."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairgate.loadgen.simulator import Simulation, SimulationConfig
from tests.unit.simulated_runs import BURSTS, FLOOD, POOL, requests_strategy, workload_of

shapes = st.tuples(
    st.sampled_from([2, 4]),  # shards
    st.sampled_from([0.05, 0.5]),  # tau
    st.booleans(),  # T0 reaches shard 0 only
    st.one_of(st.none(), st.tuples(st.integers(0, 1), st.floats(0.5, 15.0))),  # a shard lost, and when
)


@settings(max_examples=60, deadline=None)
@given(requests_strategy, shapes)
@example(FLOOD, (2, 0.05, True, (0, 3.0)))
@example(BURSTS, (4, 0.5, False, (1, 6.0)))
def test_shards_keep_the_bound_answer_each_request_once_and_agree_on_the_counters(rows, shape):
    shards, tau, pinned, lost = shape
    workload = workload_of(rows)
    config = SimulationConfig(
        kv_tokens=POOL, drain=True, replicas=4, shards=shards, tau_s=tau, pinned={"T0": 0} if pinned else {}
    )
    sim = Simulation(workload, config)
    if lost is not None:
        sim.advance(lost[1])
        sim.restart_shard(lost[0])
    sim.advance(float("inf"))
    report = sim.summary().report
    assert report["bound_held"], (report["max_abs_service_diff"], report["bound_2u"])
    for rid, rec in sim.recorder.requests.items():
        request = workload.requests[int(rid)]
        asked = request.max_tokens or request.output_tokens
        assert rec.rejected or rec.finish_s is not None, rid  # answered
        assert rec.rejected or rec.generated == min(asked, request.output_tokens), rid  # whole, never twice
    sim.exchange()
    for name, i in sim.recorder.index.items():
        for shard in sim.shards:
            t = shard.tenants.get(name)
            assert t is not None and t.service == pytest.approx(sim.recorder.service[i], abs=1e-6), name
