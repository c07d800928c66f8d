"""The dispatcher's figures exported as OpenTelemetry metrics (OTLP), when an endpoint is configured.

Observable instruments read the snapshot the dispatcher refreshes every second (never the live tables:
the SDK's reader calls back from its own thread). Per-tenant series follow the same top-N rule as
``/metrics``. Latency histograms are on ``/metrics`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fairgate.dispatcher.metrics import NODE_SERIES, OTHER, TENANT_SERIES


def start_otlp_metrics(
    read_snapshot: Callable[[], dict[str, Any] | None], top_n: int, endpoint: str | None = None, reader: Any = None
) -> Any:
    """Start exporting (to ``endpoint`` over OTLP/gRPC, or to ``reader`` in tests); returns the provider."""
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource

    if reader is None:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint), export_interval_millis=10_000)
    provider = MeterProvider(metric_readers=[reader], resource=Resource.create({"service.name": "fairgate-dispatcher"}))
    meter = provider.get_meter("fairgate")

    def tenant_values(key: str, combine: Callable) -> list[Observation]:
        snap = read_snapshot()
        if not snap:
            return []
        tenants = snap["tenants"]
        kept = sorted(tenants, key=lambda n: -tenants[n]["service"])[:top_n]
        rest = [n for n in tenants if n not in kept]
        out = [Observation(tenants[n][key], {"tenant": n}) for n in kept]
        if rest:
            out.append(Observation(combine(tenants[n][key] for n in rest), {"tenant": OTHER}))
        return out

    def node_values(key: str) -> list[Observation]:
        snap = read_snapshot()
        nodes = (snap or {}).get("nodes") or {}
        kept = sorted(nodes, key=lambda n: -nodes[n]["service"])[:top_n]
        return [Observation(float(nodes[n].get(key, 0.0)), {"node": n, "parent": nodes[n]["parent"]}) for n in kept]

    def scalar(key: str) -> Callable[[CallbackOptions], list[Observation]]:
        def callback(_: CallbackOptions) -> list[Observation]:
            snap = read_snapshot()
            value = None if not snap else snap.get(key)
            return [] if value is None else [Observation(value)]

        return callback

    for name, kind, doc, key, combine in TENANT_SERIES:
        make = meter.create_observable_counter if kind == "counter" else meter.create_observable_gauge
        make(name, callbacks=[lambda _, k=key, c=combine: tenant_values(k, c)], description=doc)
    for name, kind, doc, key, _ in NODE_SERIES:
        make = meter.create_observable_counter if kind == "counter" else meter.create_observable_gauge
        make(name, callbacks=[lambda _, k=key: node_values(k)], description=doc)
    for name, key, doc in (
        ("fairgate_queue_depth", "queue_depth", "Requests waiting in the dispatcher"),
        ("fairgate_backlog_tokens", "backlog_tokens", "Prompt plus max_tokens of every waiting request"),
        ("fairgate_fairness_gap", "gap", "Largest counter gap between backlogged siblings"),
        ("fairgate_fairness_bound_2u", "two_u", "VTC's bound 2U for that gap"),
        ("fairgate_jain_index", "jain", "Jain's index of service rates, last 60 s"),
    ):
        meter.create_observable_gauge(name, callbacks=[scalar(key)], description=doc)
    meter.create_observable_counter("fairgate_dispatched", callbacks=[scalar("dispatched")])
    return provider
