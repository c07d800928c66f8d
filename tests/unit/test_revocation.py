"""Revocation by over-service in the core: what is taken back, for whom, and that a request taken back
is neither run twice nor charged twice (docs/architecture.md, "Revocation")."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fairgate.core import FairScheduler, make_policy, unit_u
from fairgate.core.reasons import FINISH_REVOKED
from fairgate.loadgen.benches.revoke import RevokeBenchConfig, bench_revoke, count_starts, format_revoke
from fairgate.loadgen.simulator import Simulation, SimulationConfig
from tests.unit.schedulers import make
from tests.unit.simulated_runs import BURSTS, FLOOD, POOL, brute_force_max_gap, requests_strategy, workload_of


def flooded(revoke: bool = True, tree: bool = False, engine_waiting: int = 2) -> FairScheduler:
    """One worker running A's first request, A's next two queued inside its engine (assigned, not
    started), A's other three waiting in the dispatcher; its queue may grow to ``engine_waiting``."""
    s = make(revoke=revoke, max_engine_waiting=engine_waiting)
    if tree:
        s.set_node("org-a", None, 1.0)
        s.set_node("org-b", None, 1.0)
    s.add_tenant("A", 1.0, "org-a" if tree else None)
    s.add_tenant("B", 1.0, "org-b" if tree else None)
    s.worker_join("w", kv_tokens=10_000, max_running=1)
    for i in range(6):
        s.submit(f"a{i}", "A", 100, 50, 0.0)
    assert [a.request.id for a in s.assign(0.0)] == ["a0", "a1"]  # a1 waits in the engine's queue
    s.on_report("w", {"a0": 1}, started={"a0": 100}, running=1, waiting=1)
    s.workers["w"].turnover = 1.0  # the engine's queue grows two deep
    s.workers["w"].touch()  # (its table is told, as the slot's own methods do)
    assert [a.request.id for a in s.assign(0.1)] == ["a2"]
    return s


@pytest.mark.parametrize("tree", [False, True], ids=["flat", "tree"])
def test_a_newcomer_takes_back_the_newest_unstarted_requests_of_the_tenant_ahead_of_it(tree):
    s = flooded(tree=tree)
    s.submit("b0", "B", 100, 50, 0.2)
    assert s.assign(0.2) == []  # the engine's queue is full
    a = s.tenants["A"]
    before = a.counter
    taken = s.revocations()
    assert taken == [("a2", "w")]  # a1 stays: with both back, A would be level with B, not ahead
    assert s.revocations() == []  # one round out at a time
    assert s.on_finish("a2", 0, FINISH_REVOKED, 0.3) is None
    assert a.counter == pytest.approx(before - 100)  # its dispatch charge refunded
    assert a.revoked == 1 and s.is_queued("a2") and "a2" not in s.in_flight()
    assert s.assign(0.3) == []  # B, with nothing in the engines, waits here for the first slot to open
    assert s.next_in_line().id == "b0"  # ahead of A's taken request
    run_to_the_end(s, "a0", 0.4)
    s.on_report("w", {"a1": 1}, started={"a1": 100}, running=1, waiting=0)  # a1 (not taken) goes first
    assert s.assign(0.5) == []
    run_to_the_end(s, "a1", 0.6)
    assert [x.request.id for x in s.assign(0.6)] == ["b0"]  # the slot a1 leaves is b0's, not a2's
    assert s.next_in_line().id == "a2"  # back at the head of A's queue


def run_to_the_end(s: FairScheduler, rid: str, now: float) -> None:
    """``rid``, running alone on worker w, ends at its full length; the engine says so."""
    s.on_finish(rid, 50, "length", now)
    s.on_report("w", {}, running=0, waiting=0)


def test_nothing_is_taken_back_with_revocation_off_or_for_the_same_tenant():
    off = flooded(revoke=False)
    off.submit("b0", "B", 100, 50, 0.2)
    off.assign(0.2)
    assert off.revocations() == []
    alone = flooded()
    assert alone.revocations() == []  # only A waits: nothing is taken from it for itself


def test_a_request_that_started_before_the_answer_runs_and_is_charged_once():
    s = flooded()
    s.submit("b0", "B", 100, 50, 0.2)
    s.assign(0.2)
    assert s.revocations() == [("a2", "w")]
    s.on_report("w", {"a2": 1}, started={"a2": 100})  # the engine started it first: the worker says no
    assert not s.revocation.revoking  # the round is over
    assert s.on_finish("a2", 0, FINISH_REVOKED, 0.3) is None  # a stray answer changes nothing
    assert "a2" in s.in_flight() and s.tenants["A"].revoked == 0
    for rid in ("a0", "a1", "a2"):
        s.on_report("w", {}, started={rid: 100})
        s.on_finish(rid, 50, "length", 1.0)
    a = s.tenants["A"]
    assert a.counter == pytest.approx(a.service / a.weight + a.lifted)


def test_a_request_taken_back_is_charged_once_for_what_it_ran_when_it_runs_again():
    s = flooded()
    s.submit("b0", "B", 100, 50, 0.2)
    s.assign(0.2)
    s.revocations()
    s.on_finish("a2", 0, FINISH_REVOKED, 0.3)
    s.assign(0.3)
    for rid in ("a0", "a1", "b0"):
        s.on_report("w", {}, started={rid: 100}, running=1)
        run_to_the_end(s, rid, 1.0)
        s.assign(1.0)
    assert "a2" in s.in_flight()
    s.on_report("w", {"a2": 50}, started={"a2": 100})
    s.on_finish("a2", 50, "length", 2.0)
    a = s.tenants["A"]
    assert a.finished == 3 and a.service - a.unstarted == pytest.approx(3 * (100 + 2 * 50))  # a3, a4 dispatched
    assert a.counter == pytest.approx(a.service / a.weight + a.lifted)


def test_a_comer_back_is_lifted_to_what_the_least_served_has_started_not_to_what_engines_hold():
    s = flooded()
    a = s.tenants["A"]
    assert a.unstarted == pytest.approx(200)  # a1 and a2, 100 each, held while they have not started
    s.submit("b0", "B", 100, 50, 0.2)
    assert s.tenants["B"].counter == pytest.approx(a.counter - 200)
    off = flooded(revoke=False)
    off.submit("b0", "B", 100, 50, 0.2)
    assert off.tenants["B"].counter == pytest.approx(off.tenants["A"].counter)  # today's lift


def test_a_snapshot_keeps_what_is_held_and_the_round_out():
    s = flooded()
    s.submit("b0", "B", 100, 50, 0.2)
    s.assign(0.2)
    s.revocations()
    twin = FairScheduler.from_snapshot(s.snapshot())
    assert twin.revocation.revoking == s.revocation.revoking
    assert twin.tenants["A"].unstarted == pytest.approx(s.tenants["A"].unstarted)
    twin.on_finish("a2", 0, FINISH_REVOKED, 0.3)
    assert twin.is_queued("a2")


@given(requests_strategy, st.sampled_from([1, 2, 4]))
@example(FLOOD, 2)
@example(BURSTS, 1)
def test_with_revocation_the_bound_holds_nothing_starts_twice_and_the_books_balance(rows, max_running):
    """Random and adversarial workloads on engines whose batches fill (their queues hold unstarted
    requests), revocation on: every backlogged pair inside the stated bound, each request started by
    an engine at most once, and every counter equal to weighted service plus lifts once all settled."""
    workload = workload_of(rows, prefixed=True)
    sim = Simulation(
        workload,
        SimulationConfig(kv_tokens=POOL, drain=True, revoke=True, max_running=max_running, preempt_by="priority"),
    )
    starts = count_starts(sim)
    sim.advance(float("inf"))
    s = sim.scheduler
    assert s.queue_depth() == 0 and not s.in_flight()
    assert max(starts.values(), default=1) == 1
    bound = make_policy("vtc").bound(unit_u(sim.config.cost, *workload.longest(), POOL))
    for (f, g), gap in brute_force_max_gap(sim).items():
        assert gap <= bound + 1e-6, (sim.recorder.tenants[f], sim.recorder.tenants[g], gap, bound)
    for t in s.tenants.values():
        assert t.counter == pytest.approx(t.service / t.weight + t.lifted, abs=1e-6)
        assert t.unstarted == pytest.approx(0.0, abs=1e-6)


def test_the_bench_runs_both_arms_on_the_same_traffic_and_reports_what_it_measured():
    """``fairgate bench revoke``, short: both arms served the light tenant, the revoking arm took
    requests back, none started twice, the books balance, and the figures it prints are there."""
    result = bench_revoke(RevokeBenchConfig(seeds=(1,), duration_s=60.0))
    off, on = result["arms"]["off"], result["arms"]["revoke"]
    assert off["light_requests"] == on["light_requests"] > 10  # the same traffic
    assert off["revoked"] == 0 and on["revoked"] > 0
    assert result["ran_twice"] == 0 and result["books_balanced"] and result["bound_held"]
    assert result["throughput_ratio"] == pytest.approx(1.0, abs=0.05)
    assert off["ceiling_ttft_p50_s"] < off["light_ttft_p50_s"]  # the first slot to open comes before the queue
    assert "light tenant's first token" in format_revoke(result)


def test_a_request_already_queued_in_an_engine_behind_the_flood_takes_back_what_vtc_would_serve_after_it():
    s = make(revoke=True, max_engine_waiting=3)
    s.add_tenant("A", 1.0)
    s.add_tenant("B", 1.0)
    s.worker_join("w", kv_tokens=10_000, max_running=2)
    s.submit("b0", "B", 100, 50, 0.0)
    assert [x.request.id for x in s.assign(0.0)] == ["b0"]
    s.on_report("w", {"b0": 1}, started={"b0": 100}, running=1, waiting=0)
    for i in range(3):
        s.submit(f"a{i}", "A", 100, 50, 0.1)
    s.workers["w"].turnover = 1.5  # the engine's queue grows three deep
    s.workers["w"].touch()
    assert [x.request.id for x in s.assign(0.1)] == ["a0", "a1", "a2"]  # a0 starts, a1 and a2 wait in it
    s.on_report("w", {"b0": 1, "a0": 1}, started={"a0": 100}, running=2, waiting=2)
    s.submit("b1", "B", 100, 50, 0.2)  # B has b0 in the engine: b1 waits in its queue, behind a1 and a2
    assert [x.request.id for x in s.assign(0.2)] == ["b1"]
    assert s.revocations() == [("a2", "w")]  # a1 stays: with both back, A would be level with B
    s.on_finish("a2", 0, FINISH_REVOKED, 0.3)
    assert [x.request.id for x in s.assign(0.3)] == ["a2"]  # back into the engine, behind b1
    assert s.revocations() == []  # and b1 is never taken back for it


def two_engines_full() -> FairScheduler:
    """w1 runs C's long c0, w2 runs A's short a0; A's a1 waits in w2's queue (its slot opens first),
    a2 in w1's; B's b0 has just arrived, with nothing in the engines."""
    s = make(revoke=True, max_engine_waiting=1)
    for name in "ABC":
        s.add_tenant(name, 1.0)
    s.worker_join("w1", kv_tokens=10_000, max_running=1)
    s.worker_join("w2", kv_tokens=10_000, max_running=1)
    for rid, tenant, prompt, longest, worker in (("c0", "C", 100, 500, "w1"), ("a0", "A", 300, 10, "w2")):
        s.submit(rid, tenant, prompt, longest, 0.0)
        assert [(x.request.id, x.worker_id) for x in s.assign(0.0)] == [(rid, worker)]
        s.on_report(worker, {rid: 1}, started={rid: prompt}, running=1, waiting=0)
    s.submit("a1", "A", 40, 10, 0.0)
    s.submit("a2", "A", 40, 10, 0.0)
    assert [(x.request.id, x.worker_id) for x in s.assign(0.0)] == [("a1", "w2"), ("a2", "w1")]
    s.submit("b0", "B", 40, 10, 0.1)
    return s


def test_a_newcomer_waits_for_the_first_batch_slot_to_open_on_any_engine():
    """Nothing of B's is in the engines: what it is owed is taken back on every worker, and it starts
    where a slot opens first, not in the queue of the engine it happened to be placed on."""
    s = two_engines_full()
    assert s.assign(0.1) == []
    assert sorted(s.revocations()) == [("a1", "w2"), ("a2", "w1")]
    for rid in ("a1", "a2"):
        s.on_finish(rid, 0, FINISH_REVOKED, 0.2)
    assert s.assign(0.2) == []  # both queues have room, but neither engine would start it now
    s.on_finish("a0", 10, "length", 0.3)  # w2's slot opens first
    s.on_report("w2", {}, running=0, waiting=0)
    assert [(x.request.id, x.worker_id) for x in s.assign(0.3)] == [("b0", "w2")]


def test_a_request_its_engine_refused_to_give_back_is_not_asked_for_again():
    s = two_engines_full()
    s.assign(0.1)
    s.revocations()
    s.revocation_answered("a2", refused=True)  # w1 had begun it
    s.on_finish("a1", 0, FINISH_REVOKED, 0.2)
    a2 = s.in_flight()["a2"]
    assert a2.refused and not a2.beyond_room and s.workers["w1"].beyond == 0  # in w1's batch, not its queue
    assert s.revocations() == []
