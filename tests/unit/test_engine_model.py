"""The shared engine model: continuous batching over a KV pool, step time, preemption."""

from __future__ import annotations

import json

import pytest

from fairgate.loadgen.datasets import COST_PROFILE
from fairgate.workers.engines.simulated import EngineRequest, SimulatedEngine, StepTimeModel

UNIT = StepTimeModel(0.01, 0.0, 0.0, 0.0)  # every step 10 ms


def drive(engine: SimulatedEngine, max_steps: int = 10_000):
    """Run steps until idle; yield each report."""
    for _ in range(max_steps):
        if engine.begin_step() is None:
            return
        yield engine.end_step()


def test_prefill_gives_first_token_then_one_token_per_step():
    e = SimulatedEngine(1000, UNIT)
    e.add(EngineRequest("r", prompt_tokens=10, max_tokens=5, target_output=5))
    reports = list(drive(e))
    assert len(reports) == 5
    assert reports[0].started == {"r": 10} and reports[0].new_tokens == {"r": 1}
    assert all(rep.new_tokens == {"r": 1} for rep in reports)
    assert [(f.id, f.output_tokens, f.reason) for f in reports[-1].finished] == [("r", 5, "length")]
    assert reports[-1].free_tokens == 1000


def test_stops_at_its_own_length_before_max_tokens():
    e = SimulatedEngine(1000, UNIT)
    e.add(EngineRequest("r", 10, max_tokens=50, target_output=3))
    reports = list(drive(e))
    assert reports[-1].finished[0].reason == "stop" and reports[-1].finished[0].output_tokens == 3


def test_free_tokens_track_every_context_and_block_rounding():
    e = SimulatedEngine(1024, UNIT, block_size=16)
    e.add(EngineRequest("a", 20, 10, 10))
    e.add(EngineRequest("b", 40, 10, 10))
    e.begin_step()
    rep = e.end_step()
    # contexts 21 and 41 -> 2 and 3 blocks of 16
    assert rep.free_tokens == 1024 - 5 * 16
    assert rep.running == 2 and rep.waiting == 0


def test_admission_waits_for_kv_space_in_order():
    e = SimulatedEngine(100, UNIT)
    e.add(EngineRequest("a", 60, 5, 5))
    e.add(EngineRequest("b", 60, 5, 5))
    e.begin_step()
    rep = e.end_step()
    assert rep.started == {"a": 60} and rep.waiting == 1
    reports = list(drive(e))
    assert any(r.started == {"b": 60} for r in reports)


def test_preemption_when_decode_runs_out_of_kv_and_everything_still_finishes():
    e = SimulatedEngine(100, UNIT)
    for name in "abc":
        e.add(EngineRequest(name, 20, 30, 30))  # admitted at 21 each, grow to 50 each
    reports = list(drive(e))
    assert sum(r.preempted for r in reports) > 0
    finished = {f.id: f.output_tokens for r in reports for f in r.finished}
    assert finished == {"a": 30, "b": 30, "c": 30}
    assert sum(n for r in reports for n in r.new_tokens.values()) == 90
    assert sum(len(r.started) for r in reports) == 3  # a resumed request is not "started" twice


def test_preemption_by_priority_takes_the_largest_rank_first_and_readmits_by_rank():
    """vLLM's priority policy: the victim is the running request with the largest priority value (then
    the newest), and the waiting queue, preempted requests included, goes by rank."""
    e = SimulatedEngine(100, UNIT, preempt_by="priority")
    e.add(EngineRequest("heavy", 20, 30, 30, priority=300))  # first in, yet ranked last
    e.add(EngineRequest("light", 20, 30, 30, priority=0))
    e.add(EngineRequest("mid", 20, 30, 30, priority=100))
    reports = list(drive(e))
    victims = [rid for r in reports if r.preempted for rid in ("heavy", "mid", "light") if rid not in r.new_tokens]
    assert victims and victims[0] == "heavy"
    finish_order = [f.id for r in reports for f in r.finished]
    assert finish_order[0] == "light" and sorted(finish_order) == ["heavy", "light", "mid"]
    newest = SimulatedEngine(100, UNIT)
    for name in ("heavy", "light", "mid"):
        newest.add(EngineRequest(name, 20, 30, 30))
    first_out = next(f.id for r in drive(newest) for f in r.finished)
    assert first_out == "heavy"  # vLLM's default keeps the oldest running and preempts the newest


def test_the_watermark_is_kept_free_when_admitting_beside_running_requests():
    e = SimulatedEngine(100, UNIT, watermark=0.1)
    assert e.watermark_tokens == 10
    e.add(EngineRequest("a", 49, 2, 2))
    e.add(EngineRequest("b", 40, 2, 2))  # 41 more: 90 used, under the 10 kept free only if a is alone
    e.add(EngineRequest("c", 85, 2, 2))  # alone, an engine admits it whatever the watermark
    first = (e.begin_step(), e.end_step())[1]
    assert first.started == {"a": 49}  # b would leave 10 - 1 free: under the watermark beside a
    reports = list(drive(e))
    assert {rid for r in reports for rid in r.started} == {"b", "c"}


def test_without_preemption_a_kv_shortage_stalls_requests():
    """With preemption off, over-admitted requests stall: why engines preempt and recompute."""
    e = SimulatedEngine(100, UNIT, preemption=False)
    for name in "ab":
        e.add(EngineRequest(name, 20, 60, 60))
    reports = list(drive(e, max_steps=200))
    assert sum(r.preempted for r in reports) == 0
    assert not any(r.finished for r in reports)
    assert e.has_work() and e.begin_step() is None and e.free_tokens == 0


def test_abort_frees_kv_and_reports_abort():
    e = SimulatedEngine(1000, UNIT)
    e.add(EngineRequest("r", 100, 50, 50))
    e.begin_step()
    e.end_step()
    assert e.abort("r")
    e.begin_step()
    rep = e.end_step()
    assert [(f.id, f.reason) for f in rep.finished] == [("r", "abort")]
    assert rep.free_tokens == 1000 and not e.has_work()


def test_abort_during_a_step_takes_effect_at_its_end():
    e = SimulatedEngine(1000, UNIT)
    e.add(EngineRequest("r", 100, 50, 50))
    e.begin_step()
    e.abort("r")
    rep = e.end_step()
    assert rep.new_tokens == {} and rep.finished[0].reason == "abort" and rep.free_tokens == 1000


def test_step_time_model_charges_prefill_and_decode():
    m = StepTimeModel(0.02, 0.001, 0.0005, 0.00001)
    assert m.step_time(0, 0, 0) == 0.0
    assert m.step_time(100, 4, 1000) == pytest.approx(0.02 + 0.1 + 0.002 + 0.01)


def test_fit_from_the_shared_profile_matches_the_built_in_calibration():
    fitted = StepTimeModel.from_profile(json.loads(COST_PROFILE.read_text()))
    built_in = StepTimeModel.a10g_llama7b()
    for a, b in zip(fitted.to_dict().values(), built_in.to_dict().values(), strict=True):
        assert a == pytest.approx(b, rel=0.01)


def test_deterministic():
    def trace():
        e = SimulatedEngine(300, StepTimeModel.a10g_llama7b())
        for i in range(12):
            e.add(EngineRequest(str(i), 10 + 7 * i, 40, 15 + 3 * i))
        return [(r.duration_s, r.new_tokens, r.finished, r.free_tokens) for r in drive(e)]

    assert trace() == trace()
