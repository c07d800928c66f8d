"""Placement by room and by the prefill an engine already has for its next step (``most-room``): a burst
of requests that all fit is spread over the engines, not sent whole to the emptiest one, where each
would wait for the others' prefill in one long step."""

from __future__ import annotations

from collections import Counter

from tests.unit.schedulers import make


def joined(**pools: int):
    s = make(max_engine_waiting=0)
    for worker, kv_tokens in pools.items():
        s.worker_join(worker, kv_tokens=kv_tokens, free_tokens=kv_tokens)
    return s


def test_a_burst_is_spread_by_the_prefill_each_engine_has_for_its_next_step():
    s = joined(big=8000, a=4000, b=4000, c=4000)
    for i in range(8):
        s.submit(f"r{i}", "A", 400, 10, 0.0)
    placed = Counter(a.worker_id for a in s.assign(0.0))
    assert placed == {"big": 2, "a": 2, "b": 2, "c": 2}  # the emptiest alone would take all 3,200 tokens


def test_with_no_prefill_waiting_anywhere_the_most_room_goes_first():
    s = joined(big=8000, a=4000)
    s.submit("r0", "A", 400, 10, 0.0)
    (first,) = s.assign(0.0)
    assert first.worker_id == "big"
    s.on_report("big", {"r0": 1}, started={"r0": 400}, free_tokens=8000 - 401)  # its prefill is done
    s.submit("r1", "A", 400, 10, 0.0)
    (second,) = s.assign(0.0)
    assert second.worker_id == "big"  # nothing waits to prefill on either: the room decides
