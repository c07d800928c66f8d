"""Property tests: VTC's fairness bound, the lift rule, charge settlement and snapshot/restore, on random
and adversarial traces driven through the real core and the real engine model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dispatcher.core import FairScheduler, LinearCost, SchedulerConfig, parse_policy
from loadgen.metrics import bound_2u
from loadgen.simulator import Simulation, SimulationConfig
from loadgen.workloads import TraceRequest, Workload

POOL = 1200


def brute_force_max_gap(sim: Simulation) -> dict[tuple[int, int], float]:
    """max |W_f(t1,t2) - W_g(t1,t2)| over every pair of samples inside a stretch where f and g are
    both backlogged, by direct comparison of all sample pairs (independent of the metrics code)."""
    service = np.asarray(sim.recorder.sample_service)
    backlog = np.asarray(sim.recorder.sample_backlog, dtype=bool)
    out: dict[tuple[int, int], float] = {}
    n = service.shape[1] if service.size else 0
    for f in range(n):
        for g in range(f + 1, n):
            both = backlog[:, f] & backlog[:, g]
            best = 0.0
            i = 0
            while i < len(both):
                if not both[i]:
                    i += 1
                    continue
                j = i
                while j < len(both) and both[j]:
                    j += 1
                d = service[i:j, f] - service[i:j, g]
                best = max(best, float(np.abs(d[:, None] - d[None, :]).max()))
                i = j
            out[(f, g)] = best
    return out


requests_strategy = st.lists(
    st.tuples(
        st.integers(0, 2),  # tenant
        st.floats(0, 20, allow_nan=False),  # arrival
        st.integers(1, 300),  # prompt
        st.integers(1, 300),  # output
    ),
    min_size=2,
    max_size=70,
)


def workload_of(rows, weights=(1.0, 1.0, 1.0)) -> Workload:
    reqs = sorted((TraceRequest(f"T{t}", a, p, o) for t, a, p, o in rows), key=lambda r: (r.arrival_s, r.tenant))
    return Workload("prop", 30.0, reqs, {f"T{i}": w for i, w in enumerate(weights)})


def run(workload: Workload, policy: str = "vtc", **kw) -> Simulation:
    sim = Simulation(workload, SimulationConfig(policy=policy, kv_tokens=POOL, drain=True, **kw))
    sim.advance(float("inf"))
    return sim


def assert_vtc_bound(sim: Simulation, workload: Workload) -> None:
    bound = bound_2u(LinearCost(), [(r.prompt_tokens, r.output_tokens) for r in workload.requests], POOL)
    weights = [workload.weight(t) for t in sim.recorder.tenants]
    for (f, g), gap in brute_force_max_gap(sim).items():
        assert gap <= bound / min(weights[f], weights[g]) + 1e-6, (sim.recorder.tenants[f], sim.recorder.tenants[g])
    summary = sim.summary().report
    assert summary["bound_held"]
    assert summary["max_abs_service_diff"] == pytest.approx(max(brute_force_max_gap(sim).values(), default=0.0))


# An adversary: one tenant floods with the longest prompts at once, another trickles tiny requests.
FLOOD = [(0, 0.0, 300, 300)] * 20 + [(1, 0.1 * i, 1, 1) for i in range(40)]
# Bursts from three tenants at the same instants, lengths at the extremes.
BURSTS = [(i % 3, float(i // 9) * 3.0, 1 if i % 2 else 300, 300 if i % 2 else 1) for i in range(60)]


@given(requests_strategy)
@example(FLOOD)
@example(BURSTS)
def test_vtc_keeps_every_backlogged_interval_within_2u(rows):
    workload = workload_of(rows)
    assert_vtc_bound(run(workload), workload)


@given(requests_strategy, st.tuples(st.sampled_from([1.0, 2.0, 3.0]), st.sampled_from([1.0, 2.0, 4.0])))
@example(FLOOD, (1.0, 4.0))
def test_weighted_vtc_keeps_the_weighted_bound(rows, weights):
    workload = workload_of(rows, (*weights, 1.0))
    assert_vtc_bound(run(workload), workload)


@given(requests_strategy, st.sampled_from(["vtc-predict", "vtc-oracle:0.5", "vtc-oracle"]))
def test_counters_equal_service_once_predictions_are_settled(rows, policy):
    sim = run(workload_of(rows, (1.0, 2.0, 1.0)), policy)
    assert sim.scheduler.queue_depth() == 0 and not sim.scheduler.in_flight()
    for t in sim.scheduler.tenants.values():
        assert t.counter == pytest.approx(t.service / t.weight + t.lifted, abs=1e-6)


@given(requests_strategy, st.floats(1.0, 25.0), st.sampled_from(["vtc", "vtc-oracle:0.3", "fcfs", "rpm:3"]))
def test_snapshot_restore_mid_run_changes_nothing(rows, cut, policy):
    workload = workload_of(rows)
    straight = run(workload, policy)
    resumed = Simulation(workload, SimulationConfig(policy=policy, kv_tokens=POOL, drain=True))
    resumed.advance(cut)
    resumed.scheduler = FairScheduler.from_snapshot(json.loads(json.dumps(resumed.scheduler.snapshot())))
    resumed.advance(float("inf"))
    assert resumed.scheduler.snapshot() == straight.scheduler.snapshot()
    assert resumed.summary().report == straight.summary().report


ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 3), st.integers(1, 50), st.integers(1, 50)),
        st.tuples(st.just("assign")),
        st.tuples(st.just("step")),
    ),
    max_size=120,
)


@given(ops_strategy)
def test_lift_rule_on_every_rejoin(ops):
    """Replays random events and checks each re-join against DESIGN §1's rule, computed independently."""
    s = FairScheduler(SchedulerConfig(policy=parse_policy("vtc")))
    s.worker_join("w", kv_tokens=200)
    last_left: str | None = None
    running: dict[str, int] = {}
    for n, op in enumerate(ops):
        if op[0] == "submit":
            name = f"T{op[1]}"
            tenant = s.tenants.get(name)
            before = tenant.counter if tenant else 0.0
            rejoining = not s.is_backlogged(name)
            waiting = [s.tenants[t].counter for t in s.waiting_tenants() if t != name]
            if waiting:
                floor = min(waiting)
            elif last_left is not None and last_left in s.tenants:
                floor = s.tenants[last_left].counter
            else:
                floor = before
            s.submit(f"r{n}", name, op[2], op[3], float(n))
            after = s.tenants[name].counter
            assert after == (max(before, floor) if rejoining else before)
        elif op[0] == "assign":
            queued = {t.name: len(t.queue) for t in s.tenants.values()}
            for a in s.assign(float(n)):  # in dispatch order: a tenant leaves with its last request
                running[a.request.id] = a.request.max_tokens
                queued[a.request.tenant] -= 1
                if queued[a.request.tenant] == 0:
                    last_left = a.request.tenant
        else:
            for rid, out in list(running.items()):
                s.on_report("w", {rid: out})
                s.on_finish(rid, out, "length", float(n))
                del running[rid]


def test_the_bound_check_has_teeth_fcfs_breaks_it():
    workload = workload_of(FLOOD + [(0, 0.05, 300, 300)] * 10)
    sim = run(workload, "fcfs")
    bound = bound_2u(LinearCost(), [(r.prompt_tokens, r.output_tokens) for r in workload.requests], POOL)
    assert max(brute_force_max_gap(sim).values()) > bound
    assert not sim.summary().report["bound_held"]
