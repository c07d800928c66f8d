"""Telemetry pieces in one process: spans of traced requests (in-memory exporter), the fairness figures,
histograms and service history, the Prometheus rendering, and the Grafana dashboard's queries."""

from __future__ import annotations

import json
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fairgate.common.config import TelemetrySettings
from fairgate.common.tracing import configure_tracing, finished_spans, set_tracing_active
from fairgate.core import LinearCost
from fairgate.core.fairness import backlogged_gap, fair_share_jain, jain_index, two_u
from fairgate.dispatcher.metrics import Histogram, ServiceHistory
from fairgate.ingress.prometheus import render_prometheus
from fairgate.loadgen.benches.gateway import trace_one_request
from tests.conftest import REPO


def test_every_traced_request_is_one_tree_with_the_worker_span_under_generate():
    configure_tracing(TelemetrySettings(traces="memory"), "fairgate-test")
    before = {s["span_id"] for s in finished_spans()}
    for i in range(40):
        trace_one_request(i)
    spans = [s for s in finished_spans() if s["span_id"] not in before]
    traces: dict[str, dict[str, dict]] = {}
    for s in spans:
        traces.setdefault(s["trace_id"], {})[s["name"]] = s
    assert len(traces) == 40
    for tree in traces.values():
        assert set(tree) == {"fairgate.request", "fairgate.queue", "fairgate.generate", "fairgate.worker.generate"}
        root = tree["fairgate.request"]
        assert tree["fairgate.queue"]["parent_id"] == root["span_id"]
        assert tree["fairgate.worker.generate"]["parent_id"] == tree["fairgate.generate"]["span_id"]
        assert root["attributes"]["fairgate.completion_tokens"] == 2
    set_tracing_active(False)  # off: nothing more is recorded
    for i in range(10):
        trace_one_request(i)
    assert len(finished_spans()) == len(before) + len(spans)
    set_tracing_active(True)


def test_fairness_figures():
    assert jain_index([1, 1, 1]) == pytest.approx(1.0)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)
    assert jain_index([]) is None
    assert backlogged_gap({"a": 10.0, "b": 4.0, "c": 100.0}, ["a", "b"]) == 6.0
    assert backlogged_gap({"a": 10.0}, ["a"]) == 0.0
    assert two_u(LinearCost(1, 2), longest_prompt=500, longest_output=100, pool_tokens=1000) == 2 * 2000
    assert two_u(LinearCost(1, 2), longest_prompt=5000, longest_output=100, pool_tokens=1000) == 2 * 5000


def test_the_fair_share_index_never_passes_one():
    """Equal ratios sum to an index an ulp over 1 in floating point (five tenants at 0.7 of their share:
    the live page's /metrics once showed 1.0000000000000002)."""
    assert fair_share_jain([0.7] * 5, [1.0] * 5) == 1.0
    assert fair_share_jain([0.3] * 6, [1.0] * 6) == 1.0


def test_live_jain_accounts_for_demand_like_the_report():
    """Weights 2:1:1 on an uncontended pool, one tenant asking for little: everyone got all it asked
    for, so the index is 1 (it read 0.75 when it compared weight-normalised rates alone). Under
    contention, a waiting tenant served below its share brings it down."""

    def jain(rates: dict[str, float], weights: dict[str, float], queued: dict[str, int]) -> float | None:
        history = ServiceHistory()
        for t in range(11):
            history.add(
                float(t),
                {
                    n: {
                        "service": r * t,
                        "counter": 0,
                        "queued": queued.get(n, 0),
                        "weight": weights[n],
                        "output_tokens": 0,
                    }
                    for n, r in rates.items()
                },
            )
        return history.jain(60.0)

    weights = {"a": 2.0, "b": 1.0, "c": 1.0}
    assert jain({"a": 10.0, "b": 10.0, "c": 2.0}, weights, {}) == pytest.approx(1.0)
    assert jain({"a": 10.0, "b": 5.0, "c": 5.0}, weights, {"a": 3, "b": 3, "c": 3}) == pytest.approx(1.0)
    assert jain({"a": 5.0, "b": 10.0, "c": 5.0}, weights, {"a": 3, "b": 3, "c": 3}) < 0.95  # a got half its share


def test_histogram_and_service_history():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 7.0):
        h.observe(v)
    assert h.counts == [2, 1, 1] and h.count == 4 and h.sum == pytest.approx(7.65)
    history = ServiceHistory(keep=5)
    row = {"counter": 0, "queued": 1, "weight": 1, "output_tokens": 0}
    for t in range(8):
        history.add(float(t), {"a": {**row, "service": 10.0 * t}, "b": {**row, "service": 30.0 * t, "weight": 3}})
    assert len(history.samples) == 5
    assert history.rates(2.0) == {"a": pytest.approx(10.0), "b": pytest.approx(30.0)}
    assert history.jain(60.0) == pytest.approx(1.0)  # equal once divided by the weights


def snapshot() -> dict:
    tenants = {
        name: {
            "weight": 1.0,
            "counter": c,
            "service": c,
            "queued": q,
            "queued_tokens": 0,
            "in_flight": 0,
            "submitted": 0,
            "rejected": 0,
            "finished": 1,
            "output_tokens": int(c),
            "prompt_tokens": 100,
            "cached_tokens": 25,
        }
        for name, c, q in (("big", 900.0, 3), ("mid", 500.0, 2), ("small1", 10.0, 0), ("small2", 5.0, 1))
    }
    worker = {"id": "w0", "kv_tokens": 1000, "free_tokens": 400, "running": 3, "draining": False}
    worker |= {"prompt_tokens": 400, "cached_tokens": 100}
    h = Histogram()
    h.observe(0.2)
    return {
        "tenants": tenants,
        "workers": [worker],
        "queue_depth": 6,
        "in_flight": 3,
        "backlog_tokens": 120,
        "gap": 400.0,
        "two_u": 4000.0,
        "jain": 0.8,
        "dispatched": 17,
        "ttft": h.snapshot(),
        "latency": h.snapshot(),
        "nodes": {
            name: {"weight": w, "parent": parent, "counter": c, "service": c * w, "waiting": True, "gap": 7.0}
            for name, parent, w, c in (("org", "", 2.0, 700.0), ("team", "org", 1.0, 350.0), ("tiny", "", 1.0, 1.0))
        },
    }


def test_node_series_are_capped_like_tenants_and_only_for_the_admin():
    text = render_prometheus(snapshot(), top_n=2).decode()
    samples = {(s.name, s.labels.get("node", "")): s for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("fairgate_node_virtual_service", "org")].value == 700
    assert samples[("fairgate_node_service_total", "team")].labels["parent"] == "org"
    assert samples[("fairgate_node_fairness_gap", "org")].value == 7 and ("fairgate_node_weight", "tiny") not in samples
    anonymous = render_prometheus(snapshot(), top_n=0, inside=False).decode()
    assert "fairgate_node_" not in anonymous


def test_quota_series_per_node_and_window_only_for_the_admin():
    row = {"node": "org", "window": "hour", "max_tokens": 1000, "used_tokens": 300, "held_tokens": 200}
    money = {"node": "team", "window": "day", "max_tokens": None, "max_cost": 5.0, "used_tokens": 10}
    data = snapshot() | {
        "quotas": [
            row | {"max_cost": None, "remaining_tokens": 500, "used_cost": 0.1, "held_cost": 0.0, "resets_in_s": 10.0},
            money | {"used_cost": 1.5, "held_cost": 0.5, "remaining_cost": 3.0, "resets_in_s": 10.0},
        ]
    }
    text = render_prometheus(data, top_n=2).decode()
    samples = {(s.name, s.labels.get("node", "")): s for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("fairgate_quota_used_tokens", "org")].value == 300
    assert samples[("fairgate_quota_held_tokens", "org")].labels["window"] == "hour"
    assert samples[("fairgate_quota_remaining_tokens", "org")].value == 500
    assert samples[("fairgate_quota_limit_tokens", "org")].value == 1000
    assert samples[("fairgate_quota_remaining_cost", "team")].value == 3.0
    assert ("fairgate_quota_limit_tokens", "team") not in samples and (
        "fairgate_quota_limit_cost",
        "org",
    ) not in samples
    assert "fairgate_quota_" not in render_prometheus(data, top_n=0, inside=False).decode()


def test_an_anonymous_scrape_shows_nothing_of_the_pools_inside():
    """No worker ids, KV, queue depths or worker count without the admin key; the fairness gauges stay."""
    anonymous = render_prometheus(snapshot(), top_n=0, inside=False).decode()
    names = {s.name for f in text_string_to_metric_families(anonymous) for s in f.samples}
    assert not {n for n in names if n.startswith("fairgate_worker")}
    assert not names & {"fairgate_queue_depth", "fairgate_backlog_tokens", "fairgate_in_flight_requests"}
    assert {"fairgate_fairness_gap", "fairgate_fairness_bound_2u"} <= names
    admin = render_prometheus(snapshot(), top_n=2).decode()
    assert "fairgate_worker_kv_tokens" in admin and "fairgate_queue_depth" in admin


def test_prometheus_rendering_caps_tenant_labels():
    text = render_prometheus(snapshot(), top_n=2).decode()
    samples = {
        (s.name, s.labels.get("tenant", s.labels.get("worker", ""))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("fairgate_tenant_service_total", "big")] == 900
    assert samples[("fairgate_tenant_service_total", "other")] == 15  # small1 + small2
    assert ("fairgate_tenant_service_total", "small1") not in samples
    assert samples[("fairgate_tenant_virtual_service", "other")] == 10  # the largest counter among the rest
    assert samples[("fairgate_worker_kv_used_tokens", "w0")] == 600
    assert samples[("fairgate_worker_prefix_hit_ratio", "w0")] == 0.25
    assert samples[("fairgate_tenant_cached_prompt_tokens_total", "other")] == 50
    assert samples[("fairgate_ttft_seconds_count", "")] == 1 and samples[("fairgate_dispatched_total", "")] == 17
    assert samples[("fairgate_fairness_gap", "")] == 400 and samples[("fairgate_jain_index", "")] == 0.8


def test_grafana_dashboard_queries_only_metrics_that_exist():
    text = render_prometheus(snapshot(), top_n=2).decode()
    exposed = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    dashboard = json.loads((REPO / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 12
    for expr in exprs:
        for name in re.findall(r"fairgate_[a-z0-9_]+", expr):
            assert name in exposed, f"{name} in {expr!r} is not exported"


def test_otlp_metrics_export_the_same_figures_with_capped_tenants():
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from fairgate.dispatcher.otlp_metrics import start_otlp_metrics

    reader = InMemoryMetricReader()
    provider = start_otlp_metrics(snapshot, top_n=2, reader=reader)
    data = reader.get_metrics_data()
    points = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    points[(metric.name, dict(p.attributes).get("tenant", ""))] = p.value
    assert points[("fairgate_tenant_service", "big")] == 900
    assert points[("fairgate_tenant_service", "other")] == 15
    assert points[("fairgate_fairness_gap", "")] == 400 and points[("fairgate_dispatched", "")] == 17
    provider.shutdown()


BASE = {"tenants": [{"name": "a", "api_key": "k" * 16}], "admin_api_key": "admin" * 4}


def test_telemetry_section_defaults_and_refusals(monkeypatch):
    from fairgate.common.sections import ConfigError
    from fairgate.gateway.config import parse_config

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    t = parse_config(BASE)[0].telemetry
    assert (t.otlp_endpoint, t.traces, t.top_tenants, t.trace_sample_ratio) == (None, "off", 20, 1.0)
    t = parse_config({**BASE, "telemetry": {"traces": False, "trace_sample_ratio": 0.1}})[0].telemetry
    assert t.traces == "off" and t.trace_sample_ratio == 0.1  # YAML's bare off is false
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    assert parse_config(BASE)[0].telemetry.otlp_endpoint == "http://collector:4317"
    for bad in ({"traces": "all"}, {"top_tenants": 0}, {"trace_sample_ratio": 2}, {"exporter": "x"}):
        with pytest.raises(ConfigError, match="telemetry"):
            parse_config({**BASE, "telemetry": bad})


def test_the_history_keeps_a_bounded_number_of_tenants_by_name():
    history = ServiceHistory(keep=3, tenants=5)
    rows = {
        f"t{i}": {"service": float(i), "counter": 0.0, "queued": 0, "weight": 1.0, "output_tokens": 0}
        for i in range(1000)
    }
    rows["t3"]["queued"] = 2  # waiting: kept by name although little served
    for now in (0.0, 1.0, 2.0):
        history.add(now, rows)
    sample = history.samples[-1][1]
    assert set(sample) == {"t999", "t998", "t997", "t996", "t995", "t3", "other"}
    assert sample["other"]["service"] == sum(range(1000)) - sum((999, 998, 997, 996, 995, 3))
    assert "other" not in history.rates(10.0)
