"""Workload presets, custom specs and traces."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from fairgate.loadgen.trace import load_trace_csv, synthesize_arena_trace
from fairgate.loadgen.workload import WorkloadError
from fairgate.loadgen.workload_spec import load_workloads
from fairgate.loadgen.workloads import PRESETS, dist_shift, overload


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_generates_deterministically(name):
    first = load_workloads(name, seed=7)
    again = load_workloads(name, seed=7)
    assert [w.requests for w in first] == [w.requests for w in again]
    for w in first:
        assert w.requests and all(0 <= r.arrival_s <= w.duration_s for r in w.requests)
        assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in w.requests)
        assert [r.arrival_s for r in w.requests] == sorted(r.arrival_s for r in w.requests)


def test_overload_has_the_papers_rates_and_lengths():
    w = overload(1)
    counts = Counter(r.tenant for r in w.requests)
    assert counts["A"] == pytest.approx(1.5 * 600, abs=2) and counts["B"] == pytest.approx(3 * 600, abs=2)
    assert {(r.prompt_tokens, r.output_tokens) for r in w.requests} == {(256, 256)}


def test_on_off_sends_only_in_even_periods():
    w = load_workloads("on_off_less")[0]
    assert all(int(r.arrival_s // 60) % 2 == 0 for r in w.requests if r.tenant == "A")


def test_rate_scale_multiplies_rates():
    base, scaled = overload(3), load_workloads("overload", seed=3, rate_scale=4)[0]
    assert len(scaled.requests) == pytest.approx(4 * len(base.requests), rel=0.01)


def test_weighted_and_ablation_presets():
    w = load_workloads("overload_weighted")[0]
    assert [w.weight(t) for t in w.tenants] == [1.0, 2.0, 3.0, 4.0]
    ablation = load_workloads("ablation")
    assert {(a.kv_tokens, a.requests[0].prompt_tokens) for a in ablation} == {
        (kv, n) for kv in (35_000, 65_000) for n in (256, 512, 768)
    }


def test_dist_shift_idle_period_is_a_parameter():
    assert len(dist_shift(1, idle_s=120).requests) != len(dist_shift(1, idle_s=30).requests)


def test_real_trace_from_csv(arena_trace):
    (w,) = load_workloads(str(arena_trace))
    assert len(w.requests) == 1500 and len(w.tenants) == 27 and w.duration_s == 600.0


def test_synthesised_trace_has_the_same_statistics(arena_trace):
    real_rows, _ = load_trace_csv(arena_trace)
    synth_rows, duration = synthesize_arena_trace(seed=5)
    assert duration == 600.0 and len(synth_rows) == len(real_rows)
    real_counts = sorted(Counter(r[0] for r in real_rows).values())
    synth_counts = sorted(Counter(r[0] for r in synth_rows).values())
    assert real_counts == synth_counts
    for col in (2, 3):
        real_mean = sum(r[col] for r in real_rows) / len(real_rows)
        synth_mean = sum(r[col] for r in synth_rows) / len(synth_rows)
        assert synth_mean == pytest.approx(real_mean, rel=0.2)


def test_custom_yaml_spec(tmp_path):
    spec = tmp_path / "mine.yaml"
    spec.write_text(
        "name: mine\nduration_s: 100\nkv_tokens: 5000\ntenants:\n"
        "  - {name: a, rate: 1, prompt_len: 10, output_len: [5, 9], weight: 2}\n"
        "  - {name: b, phases: [{start_s: 50, end_s: 100, rate: 2, arrival: poisson}]}\n"
    )
    (w,) = load_workloads(str(spec))
    assert w.name == "mine" and w.kv_tokens == 5000 and w.weight("a") == 2.0
    assert all(5 <= r.output_tokens <= 9 for r in w.requests if r.tenant == "a")
    assert all(r.arrival_s >= 50 for r in w.requests if r.tenant == "b")


def test_custom_json_spec(tmp_path):
    spec = tmp_path / "mine.json"
    spec.write_text(json.dumps({"duration_s": 10, "tenants": [{"name": "x", "rate": 3}]}))
    (w,) = load_workloads(str(spec))
    assert len(w.requests) == 30


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("tenants: [}", "cannot parse"),
        ("[1, 2]", "must be a mapping"),
        ("duration_s: 10\ntenants: []", "non-empty list"),
        ("duration_s: -1\ntenants: [{name: a, rate: 1}]", "duration_s must be positive"),
        ("duration_s: 10\ntenants: [{name: a}]", "needs 'rate' or 'phases'"),
        ("duration_s: 10\ntenants: [{name: a, rate: 1, colour: red}]", "unknown field"),
        ("duration_s: 10\ntenants: [{name: a, rate: 1, prompt_len: [9, 3]}]", "prompt_len"),
        ("duration_s: 10\ntenants: [{name: a, rate: 1, arrival: bursty}]", "arrival"),
        ("duration_s: 10\ntenants: [{name: a, rate: 1}, {name: a, rate: 2}]", "unique"),
    ],
)
def test_malformed_specs_name_the_problem(tmp_path, content, message):
    spec = tmp_path / "bad.yaml"
    spec.write_text(content)
    with pytest.raises(WorkloadError, match=message):
        load_workloads(str(spec))


def test_malformed_trace_and_unknown_names(tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text("req_id,client,prompt_len\n1,a,3\n")
    with pytest.raises(WorkloadError, match="missing column"):
        load_workloads(str(bad))
    bad.write_text("req_id,client,prompt_len,output_len,req_time_s\n1,a,x,3,0\n")
    with pytest.raises(WorkloadError, match="line 2"):
        load_workloads(str(bad))
    with pytest.raises(WorkloadError, match="unknown workload"):
        load_workloads("nonsense")
    with pytest.raises(WorkloadError, match="does not exist"):
        load_workloads(str(tmp_path / "missing.yaml"))
    with pytest.raises(WorkloadError, match="traces"):
        load_workloads("real", rate_scale=2)
