"""Property tests of VTC's own rules and of the report that measures them, on random and adversarial
traces driven through the real core and the real engine model. (Every policy's stated bound, its
counters and its snapshots are checked by the conformance suite, ``test_policy_conformance``.)"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fairgate.core import FairScheduler, LinearCost, SchedulerConfig, two_u
from fairgate.loadgen.simulator import Simulation
from fairgate.loadgen.workload import Workload
from tests.unit.simulated_runs import BURSTS, FLOOD, POOL, brute_force_max_gap, requests_strategy, run, workload_of


def assert_report_measures_the_bound(sim: Simulation, workload: Workload) -> None:
    """The report's largest backlogged gap is the brute-force one, and its bound check agrees."""
    bound = two_u(LinearCost(), *workload.longest(), POOL)
    weights = [workload.weight(t) for t in sim.recorder.tenants]
    gaps = brute_force_max_gap(sim)
    summary = sim.summary().report
    assert summary["max_abs_service_diff"] == pytest.approx(max(gaps.values(), default=0.0))
    held = all(gap <= bound / min(weights[f], weights[g]) + 1e-6 for (f, g), gap in gaps.items())
    assert summary["bound_held"] == held


@given(requests_strategy)
@example(FLOOD)
@example(BURSTS)
def test_the_report_measures_the_backlogged_gap_as_brute_force_does(rows):
    workload = workload_of(rows)
    assert_report_measures_the_bound(run(workload), workload)


@given(requests_strategy, st.tuples(st.sampled_from([1.0, 2.0, 3.0]), st.sampled_from([1.0, 2.0, 4.0])))
@example(FLOOD, (1.0, 4.0))
def test_the_report_measures_the_weighted_gap_as_brute_force_does(rows, weights):
    workload = workload_of(rows, (*weights, 1.0))
    assert_report_measures_the_bound(run(workload), workload)


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
    """Replays random events and checks each re-join against the contract's lift rule
    (docs/architecture.md), computed independently: the paper's lift, to the least served counter
    (revocation lifts to its started service instead, which test_revocation checks)."""
    s = FairScheduler(SchedulerConfig(policy="vtc", revoke=False))
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
    workload = workload_of(FLOOD + [(0, 0.05, 300, 300, False)] * 10)
    sim = run(workload, "fcfs")
    bound = two_u(LinearCost(), *workload.longest(), POOL)
    assert max(brute_force_max_gap(sim).values()) > bound
    assert not sim.summary().report["bound_held"]
