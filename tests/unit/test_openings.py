"""When engines' batch slots open, as the dispatcher predicts it (fairgate/core/openings.py)."""

from __future__ import annotations

import math

from fairgate.core.model import Request
from fairgate.core.openings import BudgetUse, running_steps_left, steps_to_start
from fairgate.core.workers import WorkerSlot


def running(rid: str, tenant: str, worker: str, max_tokens: int, generated: int) -> Request:
    req = Request(rid, tenant, 100, max_tokens, 0.0, 0, worker=worker, started=True)
    req.output_tokens = generated
    return req


def test_a_tenant_that_stops_early_is_expected_to_stop_early():
    budget = BudgetUse()
    assert budget.expected_output("A", 200) == 200  # nothing known: all of it
    for _ in range(5):
        budget.observe("A", 50, 200)  # a quarter of its max_tokens
        budget.observe("B", 100, 100)
    assert budget.expected_output("A", 200) == 50
    assert budget.expected_output("A", 40) == 10
    assert budget.expected_output("B", 60) == 60
    assert budget.expected_output("new", 100) == 63  # every tenant's mean share (5/8 of it)


def test_the_kth_slot_to_open_is_the_kth_fewest_steps_left_after_the_free_ones():
    budget = BudgetUse()
    flight = [
        running("a", "A", "w", 50, 40),
        running("b", "A", "w", 50, 10),
        running("c", "A", "v", 50, 49),
        Request("d", "A", 100, 50, 0.0, 0, worker="w"),  # not started: no slot of its own yet
    ]
    left = running_steps_left(flight, budget)
    assert left == {"w": [10, 40], "v": [1]}
    full = WorkerSlot("w", kv_tokens=1000, max_running=2, running=2)
    assert steps_to_start(full, left["w"], ahead=0) == 10
    assert steps_to_start(full, left["w"], ahead=1) == 40
    assert steps_to_start(full, left["w"], ahead=2) == math.inf  # past what the running ones tell
    roomy = WorkerSlot("w", kv_tokens=1000, max_running=4, running=2)
    assert steps_to_start(roomy, left["w"], ahead=1) == 0  # a free slot is there now
    assert steps_to_start(roomy, left["w"], ahead=2) == 10


def test_a_request_past_its_expected_end_may_end_at_the_next_step():
    budget = BudgetUse()
    budget.observe("A", 10, 100)
    assert running_steps_left([running("a", "A", "w", 100, 30)], budget) == {"w": [1]}
