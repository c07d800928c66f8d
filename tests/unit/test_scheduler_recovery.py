"""The core's recovery events: requeue after a failed placement, adoption of re-announced requests, and
the durable state a restarted dispatcher continues from (exact charges across the restart)."""

from __future__ import annotations

import json

import pytest

from fairgate.core import FairScheduler
from tests.unit.schedulers import make, one_running


def test_requeue_puts_an_unstarted_request_back_at_the_head_with_its_charge_refunded():
    s = make()
    s.worker_join("w", kv_tokens=1000)
    s.submit("a1", "A", 100, 10, 0.0)
    s.submit("a2", "A", 100, 10, 0.0)
    first = s.assign(0.0)
    assert [a.request.id for a in first] == ["a1", "a2"]
    assert s.requeue("a2") and s.requeue("a1")
    assert s.tenants["A"].counter == pytest.approx(0.0)
    assert s.tenants["A"].service == pytest.approx(0.0)
    assert s.workers["w"].committed == 0 and s.workers["w"].pending_count == 0
    assert [r.id for r in s.tenants["A"].queue] == ["a1", "a2"]
    assert [a.request.id for a in s.assign(1.0)] == ["a1", "a2"]


def test_requeue_refuses_started_and_unknown_requests():
    s = one_running(10, 10, tokens=1)
    assert not s.requeue("r")
    assert not s.requeue("nope")


def test_a_lost_request_re_announced_by_its_worker_is_charged_only_what_is_new():
    s = one_running(100, 50, tokens=5)
    before = s.tenants["A"].counter  # 100 + 2*5
    left = s.worker_leave("w")  # the stream broke; the worker still runs it
    assert left.lost == ["r"]
    s.worker_join("w", kv_tokens=1000)
    assert s.adopt("w", "r", "A", 100, 50, output_tokens=8)
    assert s.tenants["A"].counter == pytest.approx(before + 2 * 3)
    s.on_report("w", {"r": 2})
    s.on_finish("r", 10, "length", 1.0)
    assert s.tenants["A"].service == pytest.approx(100 + 2 * 10)
    assert s.tenants["A"].output_tokens == 10
    assert s.workers["w"].committed == 0 and not s.in_flight()


def test_adopt_cancels_a_requeued_copy_and_ignores_known_requests():
    s = make()
    s.worker_join("w", kv_tokens=1000)
    s.submit("a1", "A", 10, 10, 0.0)
    s.assign(0.0)
    s.worker_leave("w")  # unstarted: back in the queue
    assert s.queue_depth() == 1
    s.worker_join("w", kv_tokens=1000)
    assert s.adopt("w", "a1", "A", 10, 10, output_tokens=1)  # it had started after all
    assert s.queue_depth() == 0 and "a1" in s.in_flight()
    assert not s.adopt("w", "a1", "A", 10, 10, output_tokens=1)
    assert not s.adopt("unknown-worker", "a2", "A", 10, 10, output_tokens=1)


def _busy_scheduler() -> FairScheduler:
    """Two tenants, one worker; A has one request running with tokens, one assigned but not started,
    B one running; both have more waiting."""
    s = make()
    s.worker_join("w", kv_tokens=10_000)
    for i in range(3):
        s.submit(f"a{i}", "A", 100, 40, float(i))
        s.submit(f"b{i}", "B", 50, 40, float(i))
    got = [a.request.id for a in s.assign(0.0)]
    assert len(got) == 6
    s.on_report("w", {"a0": 7, "b0": 3}, started={"a0": 100, "b0": 50})
    s.on_report("w", {"b1": 2}, started={"b1": 50})
    s.on_finish("b1", 2, "stop", 1.0)
    s.submit("a9", "A", 10, 10, 2.0)
    return s


def test_durable_state_continues_with_exact_charges_after_a_restart():
    """The restarted scheduler, given what the worker re-announces, ends with the very counters the
    original reaches from the same events."""
    original = _busy_scheduler()
    state = json.loads(json.dumps(original.durable_state()))
    restarted = make()
    restarted.restore_durable(state)
    assert not restarted.in_flight() and restarted.queue_depth() == 0
    # afterwards a0 and b0 ran on: 5 and 6 more tokens; a1 started (its ingress had the ticket) with 4;
    # the other assigned requests never started and are submitted again by their callers.
    original.on_report("w", {"a0": 5, "b0": 6, "a1": 4}, started={"a1": 100})
    restarted.worker_join("w", kv_tokens=10_000)
    restarted.adopt("w", "a0", "A", 100, 40, output_tokens=12)
    restarted.adopt("w", "b0", "B", 50, 40, output_tokens=9)
    restarted.adopt("w", "a1", "A", 100, 40, output_tokens=4)
    for rid in ("a2", "b2"):  # refunded in the original as well: its worker never started them
        original.requeue(rid)
    for name in ("A", "B"):
        assert restarted.tenants[name].counter == pytest.approx(original.tenants[name].counter)
        assert restarted.tenants[name].service == pytest.approx(original.tenants[name].service)
        assert restarted.tenants[name].output_tokens == original.tenants[name].output_tokens


def test_restore_durable_refuses_a_busy_scheduler_and_other_versions():
    s = _busy_scheduler()
    with pytest.raises(ValueError):
        s.restore_durable(s.durable_state())
    with pytest.raises(ValueError):
        make().restore_durable({**s.durable_state(), "version": 99})


def test_settled_requests_are_forgotten_at_every_sweep_after_one_period():
    """Each sweep drops the settled entries the one before had seen: kept between one and two periods,
    the table never grows without end (it was cleared once, at start, and then kept everything)."""
    s = make()
    s.worker_join("w", kv_tokens=1000)
    for i in range(2):
        s.submit(f"r{i}", "A", 10, 10, 0.0)
    s.assign(0.0)
    s.on_report("w", {"r0": 1, "r1": 1}, started={"r0": 10, "r1": 10})
    s.worker_leave("w")  # both lost with their worker: kept for a re-announcement
    assert set(s.recovery.settled) == {"r0", "r1"}
    s.forget_settled()
    assert set(s.recovery.settled) == {"r0", "r1"}  # one sweep: still kept
    s.worker_join("w2", kv_tokens=1000)
    s.submit("r2", "A", 10, 10, 0.0)
    s.assign(0.0)
    s.on_report("w2", {"r2": 1}, started={"r2": 10})
    s.worker_leave("w2")
    s.forget_settled()
    assert set(s.recovery.settled) == {"r2"}  # the older two went at the second sweep
    s.forget_settled()
    assert not s.recovery.settled
