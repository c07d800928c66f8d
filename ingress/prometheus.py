"""``/metrics``: one telemetry snapshot of the dispatcher as Prometheus exposition text.

Per-tenant series are kept for the ``top_n`` most served tenants, the rest summed as ``other``.
"""

from __future__ import annotations

from typing import Any

from fairgate.dispatcher.metrics import NODE_SERIES, OTHER, TENANT_SERIES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


QUOTA_SERIES = (
    ("fairgate_quota_limit_tokens", "A token quota's maximum per window", "max_tokens"),
    ("fairgate_quota_used_tokens", "Tokens used in the quota's current window by requests that ended", "used_tokens"),
    ("fairgate_quota_held_tokens", "Tokens held in the quota's current window by requests running", "held_tokens"),
    ("fairgate_quota_remaining_tokens", "Tokens the quota's current window has left", "remaining_tokens"),
    ("fairgate_quota_limit_cost", "A money quota's maximum per window", "max_cost"),
    ("fairgate_quota_used_cost", "Money used in the quota's current window by requests that ended", "used_cost"),
    ("fairgate_quota_held_cost", "Money held in the quota's current window by requests running", "held_cost"),
    ("fairgate_quota_remaining_cost", "Money the quota's current window has left", "remaining_cost"),
    ("fairgate_quota_unused_min_tokens", "Tokens of a guaranteed minimum the node has not used", "unused_min_tokens"),
    ("fairgate_quota_unused_min_cost", "Money of a guaranteed minimum the node has not used", "unused_min_cost"),
)
OBJECTIVE_COUNTERS = (
    ("fairgate_objective_admitted", "Requests of an objective class admitted in it", "admitted"),
    ("fairgate_objective_met", "Requests whose first token came within their class's objective", "met"),
    ("fairgate_objective_missed", "Requests whose first token came after their class's objective", "missed"),
    ("fairgate_objective_shed", "Requests refused at once: predicted to miss their class's objective", "shed"),
    ("fairgate_objective_downgraded", "Requests moved to a lower class: predicted to miss the objective", "downgraded"),
)
OBJECTIVE_GAUGES = (
    ("fairgate_objective_seconds", "A class's first-token objective", "objective_s"),
    (
        "fairgate_objective_prediction_error_seconds",
        "Mean |actual - predicted| first-token wait",
        "prediction_mean_abs_error_s",
    ),
    ("fairgate_objective_prediction_bias_seconds", "Mean actual - predicted first-token wait", "prediction_bias_s"),
    ("fairgate_objective_margin_seconds", "Margin added to the predicted wait before admitting", "margin_s"),
)


def render_prometheus(snapshot: dict[str, Any], top_n: int, inside: bool = True) -> bytes:
    """The exposition text of one telemetry snapshot. ``inside`` False (an anonymous scrape): nothing
    of the pool's inside (no worker ids or their KV, no queue depths or backlog, no worker count)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    tenants: dict[str, dict[str, Any]] = snapshot["tenants"]
    kept = sorted(tenants, key=lambda n: -tenants[n]["service"])[:top_n]
    rest = [n for n in tenants if n not in kept]

    families: list[Any] = []

    def per_tenant(family: Any, key: str, combine: Any = sum) -> None:
        for name in kept:
            family.add_metric([name], tenants[name][key])
        if rest:
            family.add_metric([OTHER], combine(tenants[n][key] for n in rest))
        families.append(family)

    for name, kind, doc, key, combine in TENANT_SERIES:
        family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        per_tenant(family(name, doc, labels=["tenant"]), key, combine)
    nodes: dict[str, dict[str, Any]] = snapshot.get("nodes") or {}
    shown = sorted(nodes, key=lambda n: -nodes[n]["service"])[:top_n]  # capped like tenants; none anonymous
    for name, kind, doc, key, _ in NODE_SERIES if shown else ():
        family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, doc, labels=["node", "parent"])
        for node in shown:
            family.add_metric([node, nodes[node]["parent"]], float(nodes[node].get(key, 0.0)))
        families.append(family)
    quotas = (snapshot.get("quotas") or []) if top_n else []  # named tenants and nodes: the admin's scrape only
    for name, doc, key in QUOTA_SERIES if quotas else ():
        rows = [row for row in quotas if row.get(key) is not None]
        if rows:
            family = GaugeMetricFamily(name, doc, labels=["node", "window"])
            for row in rows:
                family.add_metric([row["node"], row["window"]], float(row[key]))
            families.append(family)
    objectives: dict[str, dict[str, Any]] = (snapshot.get("objectives") or {}) if inside else {}
    families += _objective_families(objectives)
    families += _adapter_families(snapshot) if inside else []
    scalars = [
        ("fairgate_fairness_gap", "Largest counter gap between backlogged siblings", snapshot["gap"]),
        ("fairgate_fairness_bound_2u", "VTC's bound 2U for that gap, for the current pool", snapshot["two_u"]),
    ]
    if inside:
        scalars += [
            ("fairgate_queue_depth", "Requests waiting in the dispatcher", snapshot["queue_depth"]),
            ("fairgate_backlog_tokens", "Prompt plus max_tokens of every waiting request", snapshot["backlog_tokens"]),
            ("fairgate_in_flight_requests", "Requests assigned to workers", snapshot["in_flight"]),
            ("fairgate_workers", "Workers taking work", sum(1 for w in snapshot["workers"] if not w["draining"])),
        ]
    for name, doc, value in scalars:
        families.append(GaugeMetricFamily(name, doc, value=value))
    families += _shard_families(snapshot, inside)
    if snapshot.get("jain") is not None:
        families.append(
            GaugeMetricFamily("fairgate_jain_index", "Jain's index of service rates, last 60 s", value=snapshot["jain"])
        )
    families.append(
        CounterMetricFamily("fairgate_dispatched", "Requests dispatched to workers", value=snapshot["dispatched"])
    )
    workers = snapshot["workers"] if inside else []
    for key, doc in (
        ("kv_tokens", "KV pool in tokens"),
        ("kv_used_tokens", "KV tokens in use"),
        ("running", "Requests running in the engine"),
    ):
        family = GaugeMetricFamily(f"fairgate_worker_{key}", doc, labels=["worker"])
        for w in workers:
            value = w["kv_tokens"] - w["free_tokens"] if key == "kv_used_tokens" else w[key]
            family.add_metric([w["id"]], value)
        families.append(family)
    for key, doc in (
        ("prompt_tokens", "Prompt tokens of requests that started on the worker"),
        ("cached_tokens", "Prompt tokens the worker found in its prefix cache"),
    ):
        family = CounterMetricFamily(f"fairgate_worker_{key}", doc, labels=["worker"])
        for w in workers:
            family.add_metric([w["id"]], w.get(key, 0))
        families.append(family)
    ratio = GaugeMetricFamily(
        "fairgate_worker_prefix_hit_ratio", "Share of started prompt tokens found cached", labels=["worker"]
    )
    for w in workers:
        ratio.add_metric([w["id"]], w["cached_tokens"] / w["prompt_tokens"] if w.get("prompt_tokens") else 0.0)
    families.append(ratio)
    for key, doc in (
        ("ttft", "Time to first token at the dispatcher"),
        ("latency", "Request latency at the dispatcher"),
    ):
        h = snapshot[key]
        cumulative, buckets = 0, []
        for bound, count in zip([*map(str, h["buckets"]), "+Inf"], h["counts"], strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        families.append(HistogramMetricFamily(f"fairgate_{key}_seconds", doc, buckets=buckets, sum_value=h["sum"]))
    registry = CollectorRegistry()
    registry.register(_Families(families))
    return generate_latest(registry)


SHARD_SERIES = (
    ("fairgate_shard_workers", "gauge", "Workers taking work, per dispatcher shard", "workers"),
    ("fairgate_shard_queue_depth", "gauge", "Requests waiting, per dispatcher shard", "queue_depth"),
    ("fairgate_shard_in_flight_requests", "gauge", "Requests assigned to workers, per dispatcher shard", "in_flight"),
    ("fairgate_shard_dispatched", "counter", "Requests dispatched, per dispatcher shard", "dispatched"),
)
ROUND_SERIES = (
    ("fairgate_shard_rounds", "counter", "Rounds run by the shards' current runner", "rounds"),
    ("fairgate_shard_round_answers_left_out", "counter", "Shards' answers missing from a round", "left_out"),
    ("fairgate_shard_requests_dealt", "counter", "Waiting requests dealt to another shard", "dealt"),
    ("fairgate_shard_restarts", "counter", "Shards seen restarted by the rounds' runner", "restarts"),
    ("fairgate_shard_round_service", "gauge", "Most the fleet served in one round, last 60 s", "round_service"),
)


def _shard_families(snapshot: dict[str, Any], inside: bool) -> list[Any]:
    """With dispatcher shards: the fleet's bound, and (inside) each shard's figures and the rounds'."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if "fleet_bound" not in snapshot:
        return []
    families: list[Any] = [
        GaugeMetricFamily(
            "fairgate_fairness_bound_fleet",
            "The fleet's bound on the gap with dispatcher shards: their 2U plus twice one round's service",
            value=snapshot["fleet_bound"],
        )
    ]
    if not inside:
        return families
    for name, kind, doc, key in SHARD_SERIES:
        family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, doc, labels=["shard"])
        for row in snapshot["shards"]:
            if key in row:
                family.add_metric([str(row["shard"])], float(row[key]))
        families.append(family)
    rounds = snapshot.get("rounds") or {}
    for name, kind, doc, key in ROUND_SERIES:
        if key in rounds:
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            families.append(family(name, doc, value=float(rounds[key])))
    return families


def _adapter_families(snapshot: dict[str, Any]) -> list[Any]:
    """Per LoRA adapter: where it is resident (worker and tier), its loads and the time they took."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    pools = snapshot.get("pools") or {"": snapshot}
    rows = [(name, row) for pool in pools.values() for name, row in (pool.get("adapters") or {}).items()]
    resident = GaugeMetricFamily(
        "fairgate_adapter_resident",
        "1 where a LoRA adapter is loaded (tier: gpu or host)",
        labels=["adapter", "worker", "tier"],
    )
    loads = CounterMetricFamily(
        "fairgate_adapter_loads", "Loads of a LoRA adapter reported by workers", labels=["adapter"]
    )
    seconds = CounterMetricFamily(
        "fairgate_adapter_load_seconds", "Time workers spent loading a LoRA adapter", labels=["adapter"]
    )
    for name, row in rows:
        for tier in ("gpu", "host"):
            for worker in row[tier]:
                resident.add_metric([name, worker, tier], 1.0)
        loads.add_metric([name], row["loads"])
        seconds.add_metric([name], row["load_seconds"])
    return [resident, loads, seconds] if rows else []


def _objective_families(objectives: dict[str, dict[str, Any]]) -> list[Any]:
    """Per objective class: what became of its requests, and how honest its wait prediction is."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    families: list[Any] = []
    for kinds, table in ((CounterMetricFamily, OBJECTIVE_COUNTERS), (GaugeMetricFamily, OBJECTIVE_GAUGES)):
        for name, doc, key in table if objectives else ():
            family = kinds(name, doc, labels=["class"])
            for klass, row in objectives.items():
                if row.get(key) is not None:
                    family.add_metric([klass], float(row[key]))
            families.append(family)
    return families


class _Families:
    """A collector that yields families built beforehand (one snapshot, rendered once)."""

    def __init__(self, families: list[Any]) -> None:
        self._families = families

    def collect(self) -> Any:
        return iter(self._families)
