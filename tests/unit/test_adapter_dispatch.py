"""LoRA adapters in the dispatcher: a request goes only where its adapter may join the engine's batch,
placement prefers where its adapter is near, a cold adapter gets room made for it, others go within
the locality slack meanwhile, and no one is charged for a load (docs/architecture.md, "Adapters")."""

from __future__ import annotations

import pytest

from fairgate.core import FairScheduler
from fairgate.core.model import Request
from fairgate.core.placement import make_placement
from fairgate.core.workers import WorkerSlot
from fairgate.loadgen.benches.adapters import AdaptersBenchConfig, bench_adapters, format_adapters
from fairgate.loadgen.simulator import Simulation, SimulationConfig
from fairgate.loadgen.workload import TraceRequest, Workload
from fairgate.workers.engines.simulated import AdapterSettings
from tests.unit.schedulers import make


def placed(out) -> list[tuple[str, str]]:
    return [(a.request.id, a.worker_id) for a in out]


def two_adapters_each(policy: str = "vtc") -> FairScheduler:
    """Workers w1 and w2, batches of two adapters each: w1 holds x and z, w2 y and w; tenants A, B, C
    and D (x, y, z, w) have one request in flight each, D three; z's (c0) is nearly done."""
    s = make(policy, max_engine_waiting=0)
    for name in "ABCDE":
        s.add_tenant(name, 1.0)
    s.worker_join("w1", kv_tokens=10_000, max_running=16, max_loras=2)
    s.worker_join("w2", kv_tokens=10_000, max_running=16, max_loras=2)
    for rid, tenant, adapter in (("a0", "A", "x"), ("b0", "B", "y"), ("c0", "C", "z"), ("d0", "D", "w")):
        s.submit(rid, tenant, 100, 50, 0.0, adapter=adapter)
    s.submit("d1", "D", 100, 50, 0.0, adapter="w")
    s.submit("d2", "D", 100, 50, 0.0, adapter="w")
    out = dict(placed(s.assign(0.0)))
    assert (out["a0"], out["c0"], out["b0"], out["d0"]) == ("w1", "w1", "w2", "w2")
    s.on_report("w1", {"a0": 1, "c0": 45}, started={"a0": 100, "c0": 100})
    s.on_report("w2", {"b0": 10, "d0": 10}, started={"b0": 100, "d0": 100})
    return s


def test_a_request_goes_only_where_its_adapter_may_join_the_batch():
    s = make(max_engine_waiting=0)
    s.add_tenant("A", 1.0)
    s.worker_join("w", kv_tokens=10_000, max_running=16, max_loras=2)
    for i, adapter in enumerate(("x", "y", "z", "", "x")):
        s.submit(f"r{i}", "A", 100, 50, 0.0, adapter=adapter)
    assert [rid for rid, _ in placed(s.assign(0.0))] == ["r0", "r1"]  # z would be a third adapter
    slot = s.workers["w"]
    assert slot.adapters_in_flight == {"x": 1, "y": 1}
    s.on_report("w", {"r0": 50}, started={"r0": 100, "r1": 100})
    s.on_finish("r0", 50, "length", 1.0)  # x has nothing left in flight: z may join
    assert [rid for rid, _ in placed(s.assign(1.0))] == ["r2", "r3"]  # and the base model always may
    assert slot.adapters_in_flight == {"y": 1, "z": 1}


def test_placement_prefers_the_batch_then_the_gpu_then_host_memory():
    rule = make_placement("adapter-affinity")
    cold = WorkerSlot("cold", 1000, free_tokens=1000)
    host = WorkerSlot("host", 1000, free_tokens=1000, host_adapters=("x",))
    gpu = WorkerSlot("gpu", 1000, free_tokens=1000, gpu_adapters=("x",), host_adapters=("x",))
    batch = WorkerSlot("batch", 1000, free_tokens=900, adapters_in_flight={"x": 1})
    req = Request("r", "A", 10, 10, 0.0, 0, adapter="x")
    assert rule.choose([cold, host, gpu, batch], req).id == "batch"
    assert rule.choose([cold, host, gpu], req).id == "gpu"
    assert rule.choose([cold, host], req).id == "host"
    full = WorkerSlot("full", 1000, free_tokens=500, adapters_in_flight={"x": 9})
    assert rule.choose([cold, full], req).id == "cold"  # half its pool fuller: x gets one more replica


def test_a_cold_adapter_gets_room_where_an_adapter_is_expected_to_leave_soonest():
    s = two_adapters_each()
    s.submit("e0", "E", 100, 50, 0.1, adapter="v")  # a fifth adapter: no batch has room
    s.submit("c1", "C", 100, 50, 0.1, adapter="z")
    assert s.assign(0.1) == []  # E is next (least served) and blocks; VTC's order is kept
    w1 = s.workers["w1"]
    assert (w1.leaving, w1.room_for) == ("z", "v")  # c0 has 5 tokens left: z leaves w1 first
    assert not s.workers["w2"].leaving
    s.on_report("w1", {"c0": 5})
    s.on_finish("c0", 50, "length", 0.2)
    assert placed(s.assign(0.2))[0] == ("e0", "w1")


def test_within_the_locality_slack_others_go_while_room_is_made():
    s = two_adapters_each("vtc-locality:500")
    s.submit("e0", "E", 100, 50, 0.1, adapter="v")
    for rid, tenant, adapter in (("a1", "A", "x"), ("b1", "B", "y"), ("c1", "C", "z")):
        s.submit(rid, tenant, 100, 50, 0.1, adapter=adapter)
    out = placed(s.assign(0.1))
    assert sorted(out) == [("a1", "w1"), ("b1", "w2")]  # their batches keep them; within Δ of E
    assert s.next_in_line().id == "e0" and s.is_queued("c1")  # z is leaving w1: C waits
    for slack, placed_then in ((500, ["d3"]), (50, [])):
        other = two_adapters_each(f"vtc-locality:{slack}")
        other.submit("e0", "E", 100, 50, 0.1, adapter="v")
        other.on_report("w2", {"d0": 30})  # D is 60 ahead of E
        other.submit("d3", "D", 100, 50, 0.1, adapter="w")
        assert [rid for rid, _ in placed(other.assign(0.1))] == placed_then  # within Δ or not


def test_no_one_is_charged_for_an_adapter_load():
    """The pool pays for loads: a tenant whose every request needs a load from disk is charged what
    one served from the base model is, for the same tokens (a load is the dispatcher's placement, and
    charging it would make the coldest adapters pay most)."""
    requests = [
        TraceRequest(tenant, float(i), 200, 50, adapter=f"cold-{i}" if tenant == "cold" else "")
        for i in range(20)
        for tenant in ("cold", "base")
    ]
    workload = Workload("loads", 20.0, requests, {"cold": 1.0, "base": 1.0})
    settings = AdapterSettings(max_loras=1, max_cpu_loras=1)
    sim = Simulation(workload, SimulationConfig(kv_tokens=4000, adapters=settings, drain=True))
    sim.run()
    cold, base = sim.scheduler.tenants["cold"], sim.scheduler.tenants["base"]
    assert sim.engines[0].adapters.disk_loads == 20
    assert cold.counter == pytest.approx(base.counter) and cold.service == pytest.approx(base.service)


def test_the_bench_runs_its_arms_on_the_same_traffic_and_reports_what_it_measured():
    result = bench_adapters(AdaptersBenchConfig(duration_s=40.0, rate=6.0, adapters=20))
    arms = result["arms"]
    assert set(arms) == {"fairgate", "blind", "affinity"}
    assert len({a["requests"] for a in arms.values()}) == 1
    assert all(a["gpu_loads"] > 0 and a["throughput_tokens_per_s"] > 0 for a in arms.values())
    assert result["bound_held"] and result["throughput_vs_affinity"] > 0.5
    assert "prefer-loaded" in format_adapters(result)
