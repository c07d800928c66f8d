"""The fleet's figures when the dispatcher is sharded (docs/shards.md), for the live page and
/metrics: shard 0's telemetry (its counters are the fleet's, a round late at most) with a row per
shard, the rounds' own figures, the gap between tenants backlogged anywhere in the fleet, and the
fleet's bound: the shards' 2U together (each over its own workers' memory; their sum is at least the
fleet's) plus twice the most the fleet served in one round."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fairgate.core.fairness import backlogged_gap
from fairgate.core.shards import sharded_bound


def shard_row(shard: int, data: Mapping[str, Any], workers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One shard's row, from its own telemetry sample and its workers' rows."""
    return {
        "shard": shard,
        "dispatcher_id": data.get("dispatcher_id", ""),
        "workers": sum(1 for w in workers if not w["draining"]),
        "worker_rows": [{**w, "shard": shard} for w in workers],
        "queue_depth": data["queue_depth"],
        "in_flight": data.get("in_flight", 0),
        "dispatched": data["dispatched"],
        "backlogged": list(data["backlogged"]),
        "two_u": data["two_u"],
    }


def with_fleet(data: dict[str, Any], rows: Sequence[Mapping[str, Any] | None], rounds: Mapping[str, Any]) -> None:
    """Add the fleet's figures to shard 0's telemetry ``data``: ``rows`` (``shard_row`` of each shard,
    None for one that did not answer), ``rounds`` (the first pool's, from the rounds' runner)."""
    answered = [r for r in rows if r is not None]
    backlogged = sorted({t for r in answered for t in r["backlogged"]})
    data["workers"] = [w for r in answered for w in r["worker_rows"]]
    data["queue_depth"] = sum(r["queue_depth"] for r in answered)
    data["in_flight"] = sum(r["in_flight"] for r in answered)
    data["shards"] = [
        {k: v for k, v in r.items() if k != "worker_rows"} if r is not None else {"shard": k, "answered": False}
        for k, r in enumerate(rows)
    ]
    data["rounds"] = dict(rounds)
    data["backlogged"] = backlogged
    if not data.get("nodes"):  # a tree's gaps are each node's, from shard 0's counters
        data["gap"] = backlogged_gap({n: t["counter"] for n, t in data["tenants"].items()}, backlogged)
    data["two_u"] = sum(r["two_u"] for r in answered)
    data["fleet_bound"] = sharded_bound(data["two_u"], float(rounds.get("round_service", 0.0)), len(rows))
