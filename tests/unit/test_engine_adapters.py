"""LoRA adapters in the engine model: batch slots, loads and their cost, host and GPU caches."""

from __future__ import annotations

import pytest

from fairgate.common.prefix_hashes import for_adapter
from fairgate.workers.engines.simulated import AdapterSettings, EngineRequest, SimulatedEngine, StepTimeModel
from fairgate.workers.engines.simulated.adapters import LLAMA2_7B_RANK16, AdapterCache


def engine(max_loras: int = 2, max_cpu_loras: int = 3) -> SimulatedEngine:
    settings = AdapterSettings(max_loras=max_loras, max_cpu_loras=max_cpu_loras)
    return SimulatedEngine(10_000, StepTimeModel.a10g_llama7b(), max_running=8, adapters=settings)


def request(rid: str, adapter: str, output: int = 4) -> EngineRequest:
    return EngineRequest(rid, 100, output, output, adapter=adapter)


def step(e: SimulatedEngine) -> tuple[float, list[str]]:
    duration = e.begin_step()
    return duration or 0.0, list(e.end_step().started)


def test_the_default_figures_follow_from_the_adapter_size_and_the_links():
    s = AdapterSettings()
    assert LLAMA2_7B_RANK16 == 33_554_432
    assert s.host_to_gpu_s == pytest.approx(0.00134, abs=1e-5)
    assert s.disk_to_host_s == pytest.approx(0.0268, abs=1e-4)
    with pytest.raises(ValueError):
        AdapterSettings(max_loras=4, max_cpu_loras=2)


def test_a_batch_holds_at_most_max_loras_adapters_and_a_skipped_request_keeps_its_place():
    e = engine(max_loras=2)
    for rid, adapter in (("a", "x"), ("b", "y"), ("c", "z"), ("d", "x"), ("e", "")):
        e.add(request(rid, adapter, output=2 if rid == "a" else 6))
    _, started = step(e)
    assert started == ["a", "b", "d", "e"]  # c's adapter would be a third: skipped, the rest go on
    assert [r.id for r in e.waiting] == ["c"]
    step(e)  # a ends: x stays in the batch for d
    _, started = step(e)
    assert started == []
    for _ in range(6):
        _, started = step(e)
        if started:
            break
    assert started == ["c"]  # once x or y left the batch, z joins it


def test_a_step_waits_for_its_adapters_loads_from_disk_then_only_from_host():
    e = engine(max_loras=1, max_cpu_loras=2)
    s = e.adapters.settings
    base = StepTimeModel.a10g_llama7b()
    e.add(request("a", "x", output=1))
    first, _ = step(e)
    assert first == pytest.approx(base.step_time(100, 0, 0, 1) + s.disk_to_host_s + s.host_to_gpu_s)
    e.add(request("b", "y", output=1))
    step(e)  # y evicts x from the GPU (one slot); x stays in host memory
    assert list(e.adapters.gpu) == ["y"] and list(e.adapters.host) == ["x", "y"]
    e.add(request("c", "x", output=1))
    third, _ = step(e)
    assert third == pytest.approx(base.step_time(100, 0, 0, 1) + s.host_to_gpu_s)
    assert (e.adapters.disk_loads, e.adapters.gpu_loads) == (2, 3)


def test_the_report_says_which_adapters_are_loaded_where():
    e = engine(max_loras=2, max_cpu_loras=3)
    for i, adapter in enumerate(("x", "y", "z", "w")):
        e.add(request(str(i), adapter, output=1))
        e.begin_step()
        report = e.end_step()
    assert report.adapters == ("z", "w") and report.host_adapters == ("y", "z", "w")


def test_the_cache_never_evicts_what_the_batch_needs():
    cache = AdapterCache(AdapterSettings(max_loras=2, max_cpu_loras=2))
    cache.activate(["x", "y"])
    cache.activate(["y", "z"])
    assert set(cache.gpu) == {"y", "z"} and set(cache.host) == {"y", "z"}
    assert cache.fits(["y", "z"], "y") and not cache.fits(["y", "z"], "x") and cache.fits(["y", "z"], "")


def test_a_prefix_under_one_adapter_is_no_hit_under_another():
    e = SimulatedEngine(10_000, StepTimeModel.a10g_llama7b(), prefix_caching=True, adapters=AdapterSettings())
    prefix = (11, 12, 13)
    for rid, adapter in (("a", "x"), ("b", "y"), ("c", "x")):
        e.add(EngineRequest(rid, 100, 1, 1, prefix=for_adapter(prefix, adapter), prefix_block=32, adapter=adapter))
        e.begin_step()
        report = e.end_step()
        assert report.cached[rid] == (96 if rid == "c" else 0)
