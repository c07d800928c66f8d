"""The fleet's figures with dispatcher shards (``dispatcher/fleet_view.py``) as the live page and
/metrics show them: a row per shard, the gap between tenants waiting anywhere, the fleet's bound."""

from __future__ import annotations

from fairgate.dispatcher.fleet_view import shard_row, with_fleet
from fairgate.ingress.prometheus import render_prometheus

WORKER = {"id": "w", "kv_tokens": 100, "free_tokens": 40, "running": 2, "draining": False, "cached_tokens": 0}


def shard_data(backlogged: list[str], two_u: float, queued: int) -> dict:
    return {
        "tenants": {"a": {"counter": 500.0, "service": 500.0}, "b": {"counter": 200.0, "service": 200.0}},
        "nodes": {},
        "gap": 0.0,
        "two_u": two_u,
        "queue_depth": queued,
        "backlog_tokens": 0,
        "in_flight": 2,
        "dispatched": 7,
        "backlogged": backlogged,
        "workers": [WORKER],
        "ttft": {"buckets": [1.0], "counts": [0, 0], "sum": 0.0},
        "latency": {"buckets": [1.0], "counts": [0, 0], "sum": 0.0},
    }


def test_the_fleet_gap_counts_tenants_waiting_on_any_shard_and_the_bound_adds_two_rounds():
    data = shard_data(["a"], 1000.0, 3)  # shard 0: only a waits here
    rows = [
        shard_row(0, data | {"dispatcher_id": "d0"}, [WORKER]),
        shard_row(1, shard_data(["b"], 800.0, 4) | {"dispatcher_id": "d1"}, [{**WORKER, "id": "v"}]),
    ]
    with_fleet(data, rows, {"rounds": 12, "dealt": 3, "round_service": 50.0})
    assert data["gap"] == 300.0  # a here, b on shard 1: both backlogged in the fleet
    assert data["two_u"] == 1800.0 and data["fleet_bound"] == 1900.0
    assert (data["queue_depth"], data["in_flight"]) == (7, 4)
    assert [w["id"] for w in data["workers"]] == ["w", "v"]
    assert [r["shard"] for r in data["shards"]] == [0, 1] and "worker_rows" not in data["shards"][1]
    text = render_prometheus({**data, "tenants": {}}, top_n=10).decode()
    assert 'fairgate_shard_workers{shard="1"} 1.0' in text
    assert "fairgate_shard_requests_dealt_total 3.0" in text
    assert "fairgate_fairness_bound_fleet 1900.0" in text
    outside = render_prometheus({**data, "tenants": {}}, top_n=0, inside=False).decode()
    assert "fairgate_fairness_bound_fleet" in outside and "fairgate_shard_workers" not in outside


def test_a_shard_that_does_not_answer_is_shown_as_such_and_left_out_of_the_sums():
    data = shard_data(["a", "b"], 1000.0, 3)
    with_fleet(data, [shard_row(0, data, [WORKER]), None], {})
    assert data["shards"][1] == {"shard": 1, "answered": False}
    assert data["two_u"] == 1000.0 and data["fleet_bound"] == 1000.0
    assert b'fairgate_shard_workers{shard="0"} 1.0' in render_prometheus({**data, "tenants": {}}, top_n=10)
