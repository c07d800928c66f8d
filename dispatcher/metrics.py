"""What the dispatcher measures for operators, and the names it exports them under.

The dispatcher keeps latency histograms (first token and whole request, from its own clock: submit to
first reported token, submit to finish) and a history of each tenant's service, sampled every second,
from which the service rates and Jain's index over a window are computed. ``TENANT_SERIES`` names the
per-tenant series both exports use (Prometheus text at the ingress's ``/metrics``, OTLP from here);
per-tenant series are kept for the most served tenants, the rest summed as ``other``.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Any

from fairgate.core.fairness import fair_share_jain, max_min_shares

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
OTHER = "other"

# (metric, kind, help, stats field, how the tenants beyond the top N combine into "other")
TENANT_SERIES = [
    ("fairgate_tenant_service", "counter", "Service delivered, in cost units", "service", sum),
    ("fairgate_tenant_output_tokens", "counter", "Output tokens generated", "output_tokens", sum),
    ("fairgate_tenant_prompt_tokens", "counter", "Prompt tokens of requests that started", "prompt_tokens", sum),
    ("fairgate_tenant_cached_prompt_tokens", "counter", "Prompt tokens found in a prefix cache", "cached_tokens", sum),
    ("fairgate_tenant_requests_finished", "counter", "Requests finished", "finished", sum),
    ("fairgate_tenant_requests_rejected", "counter", "Requests refused", "rejected", sum),
    ("fairgate_tenant_virtual_service", "gauge", "VTC counter (weighted service plus lifts)", "counter", max),
    ("fairgate_tenant_queued_requests", "gauge", "Requests waiting", "queued", sum),
    ("fairgate_tenant_in_flight_requests", "gauge", "Requests running", "in_flight", sum),
    ("fairgate_tenant_weight", "gauge", "Tenant weight", "weight", max),
]
# the same for the tenant tree's nodes (organisations, teams, a key's own node of request classes)
NODE_SERIES = [
    ("fairgate_node_service", "counter", "Service delivered to the node's subtree, in cost units", "service", sum),
    (
        "fairgate_node_virtual_service",
        "gauge",
        "Node counter (subtree weighted service plus lifts)",
        "counter",
        max,
    ),
    ("fairgate_node_weight", "gauge", "Node weight among its siblings", "weight", max),
    ("fairgate_node_backlogged", "gauge", "1 while the node's subtree has waiting requests", "waiting", max),
    ("fairgate_node_fairness_gap", "gauge", "Largest counter gap between the node's backlogged children", "gap", max),
]


class Histogram:
    """Cumulative-bucket histogram (Prometheus semantics), O(log buckets) per observation."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> dict[str, Any]:
        return {"buckets": list(self.buckets), "counts": list(self.counts), "sum": self.sum, "count": self.count}


HISTORY_TENANTS = 50  # tenants kept by name in each sample of the history; the rest summed as "other"
_HISTORY_FIELDS = ("service", "counter", "queued", "weight", "output_tokens")


class ServiceHistory:
    """Per-tenant service (and counters, queues) sampled once a second for the last ``keep`` samples.

    Each sample keeps the ``tenants`` most served tenants and every tenant waiting (up to as many
    again) by name, and sums the rest as ``other``: the history's memory does not grow with the number
    of tenants (10 minutes of samples take about 0.16 MB per tenant kept)."""

    def __init__(self, keep: int = 600, tenants: int = HISTORY_TENANTS) -> None:
        self.samples: deque[tuple[float, dict[str, dict[str, float]]]] = deque(maxlen=keep)
        self.tenants = tenants

    def add(self, now: float, tenants: dict[str, dict[str, Any]]) -> None:
        by_service = sorted(tenants, key=lambda n: -tenants[n]["service"])
        kept = set(by_service[: self.tenants])
        kept.update([n for n in by_service if tenants[n]["queued"] and n not in kept][: self.tenants])
        sample = {name: {k: float(tenants[name][k]) for k in _HISTORY_FIELDS} for name in kept}
        rest = [tenants[n] for n in tenants if n not in kept]
        if rest:
            sample[OTHER] = {k: float(sum(row[k] for row in rest)) for k in _HISTORY_FIELDS}
        self.samples.append((now, sample))

    def record(self, now: float, telemetry: dict[str, Any]) -> dict[str, Any]:
        """Sample one telemetry snapshot's tenants; returns the snapshot with Jain's index (60 s) added."""
        self.add(now, telemetry["tenants"])
        telemetry["jain"] = self.jain(60.0)
        return telemetry

    def rates(self, window_s: float) -> dict[str, float]:
        """Each tenant's service per second over the last ``window_s`` (tenants present at both ends)."""
        if len(self.samples) < 2:
            return {}
        end_t, end = self.samples[-1]
        start_t, start = next(((t, s) for t, s in self.samples if t >= end_t - window_s), self.samples[0])
        span = end_t - start_t
        if span <= 0:
            return {}
        return {  # a tenant kept at one end only (it entered or left the top) has no rate to tell
            name: (row["service"] - start[name]["service"]) / span
            for name, row in end.items()
            if name in start and name != OTHER
        }

    def jain(self, window_s: float) -> float | None:
        """Jain's index of the service rates over the window against each tenant's weighted max-min
        fair share given what it asked for, as the simulator's report measures it: a tenant that never
        waited in the window got all it asked for (its demand is its rate), one that waited asked for
        more (its demand is unbounded). 1.0 on an uncontended pool, whatever the weights; below 1 only
        when a tenant that wanted more got less than its share."""
        rates = self.rates(window_s)
        if not rates:
            return None
        end_t, end = self.samples[-1]
        window = [s for t, s in self.samples if t >= end_t - window_s]
        names = [n for n, r in rates.items() if r > 0 or end[n]["queued"] > 0]
        if not names:
            return None
        waited = {n for s in window for n, row in s.items() if row["queued"] > 0}
        demand = [math.inf if n in waited else rates[n] for n in names]
        weights = [end[n]["weight"] for n in names]
        owed, _ = max_min_shares(demand, weights, sum(rates[n] for n in names))
        return fair_share_jain([rates[n] for n in names], owed)

    def series(self, window_s: float) -> list[dict[str, Any]]:
        """The samples of the last ``window_s`` (for the live page)."""
        if not self.samples:
            return []
        end_t = self.samples[-1][0]
        return [{"t": t, "tenants": s} for t, s in self.samples if t >= end_t - window_s]
