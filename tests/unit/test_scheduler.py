"""Unit tests of the pure scheduler's rules (docs/architecture.md), event by event."""

from __future__ import annotations

import json

import pytest

from fairgate.core import (
    REJECT_QUEUE_FULL,
    REJECT_RATE_LIMITED,
    REJECT_TENANT_QUEUE_FULL,
    REJECT_TOO_LARGE,
    FairScheduler,
    LinearCost,
    ProfiledCost,
    make_policy,
)
from tests.unit.schedulers import make, one_running


def run_to_completion(s: FairScheduler, now: float = 0.0) -> list[str]:
    """Dispatch what fits, start and finish each request with its max_tokens; return ids in order."""
    order = []
    for a in s.assign(now):
        r = a.request
        s.on_report(a.worker_id, {r.id: r.max_tokens}, started={r.id: r.prompt_tokens})
        s.on_finish(r.id, r.max_tokens, "length", now)
        order.append(r.id)
    return order


def test_least_served_tenant_goes_first_and_fifo_within_tenant():
    s = make()
    s.worker_join("w", kv_tokens=1000, free_tokens=1000)
    s.submit("a1", "A", 10, 10, 0.0)
    s.submit("a2", "A", 10, 10, 0.0)
    s.submit("b1", "B", 10, 10, 0.0)
    s.tenants["A"].counter = 5.0  # A has been served more than B
    s.tree.root.waiting.push("A", 5.0)
    got = [a.request.id for a in s.assign(0.0)]
    assert got == ["b1", "a1", "a2"]


def test_dispatch_charges_prompt_and_decode_charges_each_token():
    s = make(cost=LinearCost(1.0, 2.0))
    s.worker_join("w", kv_tokens=1000)
    s.submit("r", "A", 100, 50, 0.0)
    assert len(s.assign(0.0)) == 1
    assert s.tenants["A"].counter == pytest.approx(100.0)
    s.on_report("w", {"r": 1}, started={"r": 100})
    s.on_report("w", {"r": 4})
    assert s.tenants["A"].counter == pytest.approx(110.0)
    assert s.tenants["A"].service == pytest.approx(110.0)
    s.on_finish("r", 5, "stop", 1.0)
    assert s.workers["w"].committed == 0 and s.workers["w"].in_flight == 0


def test_weighted_charges_are_divided_by_weight():
    s = make()
    s.add_tenant("heavy", weight=2.0)
    s.worker_join("w", kv_tokens=1000)
    s.submit("r", "heavy", 100, 10, 0.0)
    s.assign(0.0)
    s.on_report("w", {"r": 10}, started={"r": 100})
    assert s.tenants["heavy"].counter == pytest.approx((100 + 20) / 2)
    assert s.tenants["heavy"].service == pytest.approx(120)


def test_lift_to_min_waiting_counter_on_rejoin():
    s = make()
    s.worker_join("w", kv_tokens=10)  # too small for anything below: everything stays queued
    for name, counter in (("A", 50.0), ("B", 80.0), ("C", 0.0)):
        s.add_tenant(name).counter = counter
    s.worker_leave("w")
    s.submit("a", "A", 5, 5, 0.0)
    s.submit("b", "B", 5, 5, 0.0)
    s.submit("c", "C", 5, 5, 0.0)  # C re-joins while A (50) and B (80) wait
    assert s.tenants["C"].counter == 50.0
    assert s.tenants["C"].lifted == 50.0


def test_lift_never_lowers_a_counter_debt_is_kept():
    s = make()
    s.add_tenant("A").counter = 10.0
    s.add_tenant("C").counter = 500.0
    s.submit("a", "A", 5, 5, 0.0)
    s.submit("c", "C", 5, 5, 0.0)
    assert s.tenants["C"].counter == 500.0 and s.tenants["C"].lifted == 0.0


def test_lift_to_last_left_when_no_one_waits():
    s = make()
    s.worker_join("w", kv_tokens=1000)
    s.add_tenant("idle")
    s.submit("b1", "B", 100, 10, 0.0)
    run_to_completion(s)  # B leaves the waiting set with counter 120
    assert s.tenants["B"].counter == pytest.approx(120.0)
    s.submit("i1", "idle", 10, 10, 1.0)  # no one waits: lift to the last tenant that left (B)
    assert s.tenants["idle"].counter == pytest.approx(120.0)


def test_lcf_does_not_lift():
    s = make("lcf")
    s.worker_join("w", kv_tokens=1000)
    s.submit("b1", "B", 100, 10, 0.0)
    run_to_completion(s)
    s.submit("i1", "idle", 10, 10, 1.0)
    assert s.tenants["idle"].counter == 0.0


def test_fcfs_serves_global_arrival_order():
    s = make("fcfs")
    s.worker_join("w", kv_tokens=10_000)
    for i, tenant in enumerate("ABABBA"):
        s.submit(f"r{i}", tenant, 10, 10, float(i))
    s.tenants["A"].counter = 1e9  # counters must not matter to FCFS
    assert [a.request.id for a in s.assign(9.0)] == [f"r{i}" for i in range(6)]


def _x_waits_inside_the_engine(s: FairScheduler) -> None:
    """On a 100-token engine X's first request runs, X's next (61 KV tokens) is sent to wait inside the
    engine (its queue of one), and the first finishes before it starts: 39 tokens of room are left
    beside it. Then Y's 50-token prompt (51 > 39) and X's 5-token one arrive."""
    s.worker_join("w", kv_tokens=100)
    s.submit("x", "X", 50, 10, 0.0)
    s.assign(0.0)
    s.on_report("w", {"x": 1}, started={"x": 50}, free_tokens=49, running=1, waiting=0)
    s.submit("x-wait", "X", 60, 10, 0.0)
    assert [a.request.id for a in s.assign(0.0)] == ["x-wait"]  # no room now: it waits in the engine
    s.on_finish("x", 10, "length", 1.0)
    s.on_report("w", {}, free_tokens=100, running=0, waiting=1)
    s.submit("y-big", "Y", 50, 10, 1.0)  # least served (0) but needs 51 > 39
    s.submit("x-small", "X", 5, 5, 1.0)


def test_strict_head_of_line_blocks_smaller_requests_of_others():
    s = make(revoke=False)  # without revocation, Y's next request goes into the engine's queue
    _x_waits_inside_the_engine(s)
    assert s.assign(1.0) == []  # strict: X's small request may not slip ahead of Y's
    s.on_report("w", {"x-wait": 1}, started={"x-wait": 60}, free_tokens=39, running=1, waiting=0)
    assert [a.request.id for a in s.assign(2.0)] == ["y-big"]  # into the engine's queue, X's behind it
    assert s.is_backlogged("X")


def test_relaxed_head_of_line_lets_a_fitting_request_through():
    s = make(strict_head_of_line=False)
    _x_waits_inside_the_engine(s)
    assert [a.request.id for a in s.assign(1.0)] == ["x-small"]
    assert s.is_backlogged("Y")


def test_too_large_request_is_rejected():
    s = make()
    s.worker_join("w", kv_tokens=100)
    assert s.submit("r", "A", 90, 20, 0.0) == REJECT_TOO_LARGE
    assert s.queue_depth() == 0


def test_head_request_dropped_when_the_only_big_worker_leaves():
    s = make()
    s.worker_join("big", kv_tokens=1000)
    s.worker_join("small", kv_tokens=100)
    s.submit("r", "A", 500, 10, 0.0)  # fits only the big worker, which leaves before dispatch
    s.worker_drain("big")
    s.worker_leave("big")
    assert s.assign(0.0) == []
    dropped = s.take_dropped()
    assert [(r.id, why) for r, why in dropped] == [("r", REJECT_TOO_LARGE)]
    assert not s.is_backlogged("A")


def test_rpm_rejects_over_the_limit_and_admits_after_the_window():
    s = make("rpm:2")
    s.worker_join("w", kv_tokens=10_000)
    assert s.submit("1", "A", 10, 10, 0.0) is None
    assert s.submit("2", "A", 10, 10, 10.0) is None
    assert s.submit("3", "A", 10, 10, 20.0) == REJECT_RATE_LIMITED
    assert s.submit("4", "B", 10, 10, 20.0) is None  # limits are per tenant
    assert s.submit("5", "A", 10, 10, 60.5) is None  # the first admission left the window
    assert s.tenants["A"].rejected == 1


def test_prediction_is_charged_up_front_and_refunded_at_finish():
    s = make("vtc-oracle")
    s.worker_join("w", kv_tokens=10_000)
    s.submit("r", "A", 100, 200, 0.0, true_output=50)
    s.assign(0.0)
    t = s.tenants["A"]
    assert t.counter == pytest.approx(100 + 2 * 50)  # the oracle predicts the true 50
    s.on_report("w", {"r": 30}, started={"r": 100})
    assert t.counter == pytest.approx(200)  # within the prediction: nothing more
    s.on_finish("r", 30, "stop", 1.0)  # ended short: refund 20 tokens
    assert t.counter == pytest.approx(160) == pytest.approx(t.service)


def test_prediction_overrun_charges_only_beyond_the_prediction():
    s = make("vtc-oracle")
    s.worker_join("w", kv_tokens=10_000)
    s.submit("r", "A", 100, 200, 0.0, true_output=10)
    s.assign(0.0)
    s.on_report("w", {"r": 25}, started={"r": 100})
    s.on_finish("r", 25, "length", 1.0)
    assert s.tenants["A"].counter == pytest.approx(150) == pytest.approx(s.tenants["A"].service)


def serve_one(s: FairScheduler, rid: str, max_tokens: int, output: int, reason: str = "stop") -> None:
    """Tenant A's request of 10 prompt tokens, run on worker "w" until it ends with ``output`` tokens."""
    s.submit(rid, "A", 10, max_tokens, 0.0)
    run = s.assign(0.0)[0].request
    s.on_report("w", {run.id: output}, started={run.id: 10})
    s.on_finish(run.id, output, reason, 0.0)


def test_moving_average_predictor_learns_per_tenant():
    s = make("vtc-predict")
    s.worker_join("w", kv_tokens=100_000)
    for i in range(3):
        serve_one(s, f"r{i}", 100, 40)
    s.submit("next", "A", 10, 100, 0.0)
    req = s.assign(0.0)[0].request
    assert req.predicted == 40


def test_an_aborted_request_teaches_the_predictors_what_it_generated():
    """A tenant cannot keep its predictions short by leaving its long requests before they end: what
    a started request generated teaches the policy's predictor and the footprint estimate alike."""
    s = make("vtc-predict")
    s.worker_join("w", kv_tokens=100_000)
    for i in range(20):  # twenty 1-token answers teach "short"
        serve_one(s, f"short{i}", 1000, 1)
    for i in range(20):  # then long ones, each left by its client after 500 tokens
        serve_one(s, f"long{i}", 1000, 500, "abort")
    s.submit("next", "A", 10, 1000, 0.0)
    req = s.assign(0.0)[0].request
    assert req.predicted == 500 and req.footprint == 10 + 750


def test_a_request_outgrowing_its_footprint_raises_its_workers_expected_kv_and_its_tenants_next():
    s = make()
    s.worker_join("w", kv_tokens=10_000)
    s.lengths.observe("A", 4)  # A's requests are expected to stop after 6 tokens
    s.submit("r", "A", 100, 2000, 0.0)
    s.assign(0.0)
    assert s.workers["w"].expected == 106
    s.on_report("w", {"r": 300}, started={"r": 100})
    assert s.in_flight()["r"].footprint == 400 and s.workers["w"].expected == 400
    s.submit("next", "A", 50, 2000, 0.0)
    s.assign(0.0)
    assert s.in_flight()["next"].footprint == 50 + 300  # at least what A's running request reached
    s.on_finish("r", 300, "stop", 0.0)
    s.on_finish("next", 0, "abort", 0.0)
    assert s.workers["w"].expected == 0 and s.tenants["A"].outgrown == 0


def test_exact_prompt_count_from_the_engine_replaces_the_estimate():
    s = one_running(100, 10, tokens=1, exact_prompt=120)
    assert s.tenants["A"].service == pytest.approx(120 + 2)
    assert s.workers["w"].committed == 121  # the engine's exact prompt, and its first token's slot


def test_worker_leave_requeues_unstarted_with_refund_and_loses_started():
    s = make()
    s.worker_join("w", kv_tokens=15)  # room for one 10-token prompt (and its first token), and a queue of one
    s.submit("started", "A", 10, 4, 0.0)
    s.submit("pending", "A", 10, 4, 0.0)
    s.submit("later", "A", 10, 4, 0.0)
    assert len(s.assign(0.0)) == 2
    s.on_report("w", {"started": 3}, started={"started": 10})
    before = s.tenants["A"].counter
    result = s.worker_leave("w")
    assert result.requeued == ["pending"] and result.lost == ["started"]
    assert s.tenants["A"].counter == pytest.approx(before - 10)
    assert [r.id for r in s.tenants["A"].queue] == ["pending", "later"]
    s.worker_join("w2", kv_tokens=1000)
    assert [a.request.id for a in s.assign(1.0)] == ["pending", "later"]


def test_cancel_removes_a_queued_request():
    s = make()
    s.submit("a", "A", 10, 10, 0.0)
    s.submit("b", "A", 10, 10, 0.0)
    assert s.cancel("a") and not s.cancel("a")
    assert [r.id for r in s.tenants["A"].queue] == ["b"]
    assert s.cancel("b") and not s.is_backlogged("A")


def test_abort_before_start_refunds_everything():
    s = make()
    s.worker_join("w", kv_tokens=1000)
    s.submit("r", "A", 100, 10, 0.0)
    s.assign(0.0)
    s.on_finish("r", 0, "abort", 0.5)
    assert s.tenants["A"].counter == 0 and s.tenants["A"].service == 0
    assert s.workers["w"].pending_count == 0 and s.workers["w"].committed == 0


def test_beyond_what_starts_now_requests_wait_inside_the_engine_up_to_a_depth_that_follows_its_turnover():
    s = make(max_engine_waiting=4)
    s.worker_join("w", kv_tokens=10_000, max_running=2)
    for i in range(40):
        s.submit(f"r{i}", "A", 10, 10, 0.0)
    assert len(s.assign(0.0)) == 3  # the batch's two places, and a queue of one (no turnover seen yet)
    s.on_report("w", {}, started={"r0": 10, "r1": 10}, free_tokens=9_978, running=2, waiting=1)
    assert s.assign(0.0) == []  # the batch is full and one waits inside the engine
    depths = []
    for _ in range(6):  # the engine starts two requests per report: the queue covers two reports' worth
        started = [r for r in s.in_flight().values() if not r.started][:2]
        s.on_report("w", {}, started={r.id: 10 for r in started}, free_tokens=9_978, running=2, waiting=0)
        s.assign(0.0)
        depths.append(sum(1 for r in s.in_flight().values() if not r.started))
    assert depths[0] < depths[-1] == 4  # it grew with the turnover, up to max_engine_waiting


def test_admission_follows_the_engine_rule_free_kv_above_its_watermark_and_nothing_reserved_for_output():
    s = make(max_engine_waiting=1)
    s.worker_join("w", kv_tokens=1000, watermark=50)
    s.lengths.observe("A", 4)  # A's requests stop early: each is expected to reach 100 + 6 tokens
    for i in range(5):
        s.submit(f"r{i}", "A", 100, 900, 0.0)  # max_tokens far above the pool's room: never reserved
    assert len(s.assign(0.0)) == 5  # 5 x 101 <= 1000 - 50: all start at once, as the engine alone would
    s.on_report("w", {}, started={f"r{i}": 100 for i in range(5)}, free_tokens=149, running=5, waiting=0)
    s.submit("fits", "A", 98, 10, 0.0)  # 99 KV tokens: 149 free less the 50-token watermark
    s.submit("next", "A", 98, 10, 0.0)
    got = [a.request.id for a in s.assign(0.0)]
    assert got == ["fits", "next"]  # the second waits inside the engine (its queue of depth 1)
    assert s.workers["w"].room() == 149 - 50 - 2 * 99
    s.submit("held", "A", 98, 10, 0.0)
    assert s.assign(0.0) == [] and s.is_backlogged("A")  # no room now, and the engine's queue is full


def test_placement_prefers_most_room_then_fewest_running():
    s = make()
    s.worker_join("small", kv_tokens=500)
    s.worker_join("large", kv_tokens=1000)
    s.submit("r", "A", 10, 10, 0.0)
    assert s.assign(0.0)[0].worker_id == "large"


def test_duplicate_and_invalid_requests_are_refused():
    s = make()
    s.submit("r", "A", 10, 10, 0.0)
    with pytest.raises(ValueError, match="duplicate"):
        s.submit("r", "A", 10, 10, 0.0)
    with pytest.raises(ValueError):
        s.submit("x", "A", 10, 0, 0.0)
    with pytest.raises(ValueError):
        s.add_tenant("bad", weight=0)


def test_snapshot_is_json_and_restores_every_table():
    s = make("vtc-oracle:0.3", cost=ProfiledCost())
    s.worker_join("w", kv_tokens=2000)
    for i in range(6):
        s.submit(f"r{i}", "AB"[i % 2], 100, 100, float(i), true_output=60)
    s.assign(6.0)
    s.on_report("w", {"r0": 5}, started={"r0": 100})
    snap = json.loads(json.dumps(s.snapshot()))
    r = FairScheduler.from_snapshot(snap)
    assert r.snapshot() == s.snapshot()
    assert r.stats() == s.stats()


@pytest.mark.parametrize("bad", ["nope", "rpm", "rpm:0", "rpm:x", "vtc-oracle:1.5", "rpm:2.5"])
def test_unknown_or_malformed_policy_names(bad):
    with pytest.raises(ValueError):
        make_policy(bad)


def test_queue_caps_refuse_per_tenant_and_in_total():
    s = make(max_queued_per_tenant=2, max_queued=3)
    assert s.submit("a1", "A", 10, 10, 0.0) is None
    assert s.submit("a2", "A", 10, 10, 0.0) is None
    assert s.submit("a3", "A", 10, 10, 0.0) == REJECT_TENANT_QUEUE_FULL
    assert s.submit("b1", "B", 10, 10, 0.0) is None
    assert s.submit("c1", "C", 10, 10, 0.0) == REJECT_QUEUE_FULL
    assert s.stats()["tenants"]["A"]["rejected"] == 1 and s.queue_depth() == 3
    s.worker_join("w", kv_tokens=1000, free_tokens=1000)
    run_to_completion(s)
    assert s.submit("a3", "A", 10, 10, 1.0) is None  # room again once the queue drained


def test_expire_withdraws_only_requests_waiting_too_long_and_keeps_the_lift_rule():
    s = make(max_queue_s=5.0)
    s.submit("a1", "A", 10, 10, 0.0)
    s.submit("b1", "B", 10, 10, 1.0)
    s.submit("a2", "A", 10, 10, 3.0)
    assert s.expire(4.9) == []
    assert s.expire(6.0) == ["a1", "b1"]
    assert s.queue_depth() == 1 and s.waiting_tenants() == ["A"]
    assert s.stats()["tenants"]["A"]["counter"] == 0 and s.stats()["tenants"]["A"]["service"] == 0
    s.worker_join("w", kv_tokens=1000, free_tokens=1000)
    assert run_to_completion(s, 7.0) == ["a2"]  # dispatched before it expired: never withdrawn
    assert s.expire(100.0) == []


def test_expiry_survives_a_snapshot():
    s = make(max_queue_s=5.0)
    s.submit("a1", "A", 10, 10, 0.0)
    s.submit("a2", "A", 10, 10, 4.0)
    restored = FairScheduler.from_snapshot(json.loads(json.dumps(s.snapshot())))
    assert restored.config.max_queue_s == 5.0
    assert restored.expire(6.0) == ["a1"] and restored.queue_depth() == 1


def test_expiry_follows_each_submission_and_a_request_put_back_in_its_queue():
    s = make(max_queue_s=5.0)
    s.worker_join("w", kv_tokens=1000)
    s.submit("a1", "A", 10, 10, 0.0)
    s.assign(0.0)  # a1 is assigned; its worker never starts it
    s.submit("b1", "B", 10, 10, 1.0)
    assert s.cancel("b1")
    s.submit("b1", "B", 10, 10, 4.0)  # the same id again (a client retry), later
    assert s.expire(5.5) == []  # the old submission's deadline must not withdraw the new one
    s.worker_leave("w")  # a1 goes back to its queue, still waiting since 0.0
    assert s.is_queued("a1")
    assert s.expire(6.0) == ["a1"]
    assert s.expire(9.5) == ["b1"]
