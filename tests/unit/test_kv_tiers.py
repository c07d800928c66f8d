"""KV cache tiers and the engines' KV events (docs/architecture.md): the engine model's host and shared
tiers (a hit loads instead of prefilling), the events it reports, the prefix index fed by them per
tier, placement by the prefill each tier saves, and the continuations the locality slack looks at."""

from __future__ import annotations

from fairgate.core import FairScheduler, SchedulerConfig
from fairgate.core.continuations import Continuations
from fairgate.core.model import Request
from fairgate.core.out_of_order import LOCAL_WINDOW
from fairgate.core.prefix_index import PrefixIndex
from fairgate.workers.engines.simulated import EngineRequest, SimulatedEngine, StepTimeModel
from fairgate.workers.engines.simulated.tiers import MEDIUM_GPU, MEDIUM_HOST, MEDIUM_SHARED, BlockTier, TierSettings

BLOCK = 16
PREFILL = StepTimeModel(0.0, 1.0, 0.0, 0.0)  # a step costs its prefilled tokens: skipped prefill shows


def prefix(conversation: int, blocks: int) -> tuple[int, ...]:
    return tuple(conversation * 1000 + i for i in range(blocks))


def tier(medium: str, tokens: int, seconds_per_token: float = 0.01, latency: float = 0.5) -> TierSettings:
    return TierSettings(medium, tokens, 1.0 / seconds_per_token, latency, kv_bytes_per_token=1)


def drain(engine: SimulatedEngine) -> list:
    events = []
    while engine.has_work():
        engine.begin_step()
        events.extend(engine.end_step().kv_events)
    return events


def test_a_block_evicted_from_the_pool_is_loaded_from_host_memory_not_prefilled():
    host = BlockTier(tier(MEDIUM_HOST, 10_000), emits=True)
    engine = SimulatedEngine(160, PREFILL, block_size=BLOCK, prefix_caching=True, tiers=[host], kv_events=True)
    engine.add(EngineRequest("a", 100, 2, 2, prefix=prefix(1, 6), prefix_block=BLOCK))
    first = drain(engine)
    assert ("stored", MEDIUM_GPU, prefix(1, 6)) in first and ("stored", MEDIUM_HOST, prefix(1, 6)) in first
    engine.add(EngineRequest("b", 150, 2, 2))  # fills the pool: a's cached blocks are evicted from it
    evicted = drain(engine)
    assert any(kind == "removed" and medium == MEDIUM_GPU for kind, medium, _ in evicted)
    engine.add(EngineRequest("c", 100, 2, 2, prefix=prefix(1, 6), prefix_block=BLOCK))
    duration = engine.begin_step()
    report = engine.end_step()
    assert report.cached == {"c": 96}  # all six blocks, from host memory
    assert engine.loaded_tokens_seen == 96
    # the copy (0.5 s + 96 x 0.01 s) runs beside the prefill of the last 4 tokens: the longer of the two
    assert duration == max(4.0, 0.5 + 0.96)


def test_a_shared_tier_serves_blocks_another_engine_computed_and_evicts_least_recently_used():
    shared = BlockTier(tier(MEDIUM_SHARED, 6 * BLOCK), emits=True)
    a = SimulatedEngine(1000, PREFILL, block_size=BLOCK, prefix_caching=True, tiers=[shared], kv_events=True)
    b = SimulatedEngine(1000, PREFILL, block_size=BLOCK, prefix_caching=True, tiers=[shared], kv_events=True)
    a.add(EngineRequest("x", 100, 2, 2, prefix=prefix(1, 4), prefix_block=BLOCK))
    drain(a)
    b.add(EngineRequest("y", 100, 2, 2, prefix=prefix(1, 4), prefix_block=BLOCK))
    b.begin_step()
    assert b.end_step().cached == {"y": 64}
    a.add(EngineRequest("z", 100, 2, 2, prefix=prefix(2, 4), prefix_block=BLOCK))
    events = drain(a) + drain(b)
    removed = [hashes for kind, medium, hashes in events if kind == "removed" and medium == MEDIUM_SHARED]
    assert removed == [(1003, 1002)]  # the chain's end goes first: what stays is a leading part


def test_the_index_fed_by_events_knows_each_tier_and_stops_modelling_the_pool():
    index = PrefixIndex()
    index.join("w0", 1000)
    index.join("w1", 1000)
    p = prefix(1, 6)
    index.apply_events("w0", [("stored", MEDIUM_GPU, p[:2]), ("stored", MEDIUM_HOST, p[:5])])
    index.apply_events("w1", [("stored", MEDIUM_SHARED, p)])
    assert index.expected_by_tier("w0", p, BLOCK) == (2 * BLOCK, 3 * BLOCK, 1 * BLOCK)
    assert index.expected_by_tier("w1", p, BLOCK) == (0, 0, 6 * BLOCK)  # the shared store is everyone's
    assert index.expected_tokens("w0", p, BLOCK) == 6 * BLOCK
    index.apply_events("w0", [("removed", MEDIUM_HOST, p[2:5]), ("removed", MEDIUM_GPU, p[1:2])])
    # the pool's run ends after one block, host memory's after the next; the shared store has the rest
    assert index.expected_by_tier("w0", p, BLOCK) == (BLOCK, BLOCK, 4 * BLOCK)
    index.observed("w0", 6 * BLOCK, 0, BLOCK)  # an event-fed pool is not shrunk by a miss
    assert index.stats()["w0"]["capacity"] == 1000
    assert index.agreement() == 0.0
    index.observed("w1", 6 * BLOCK, 6 * BLOCK - 3, BLOCK)  # within one hash: agreed
    assert index.agreement() == 0.5
    copy = PrefixIndex()
    copy.restore(index.snapshot())
    assert copy.expected_by_tier("w1", p, BLOCK) == index.expected_by_tier("w1", p, BLOCK)
    assert copy.expected_by_tier("w0", p, BLOCK) == index.expected_by_tier("w0", p, BLOCK)
    index.apply_events("w1", [("cleared", MEDIUM_SHARED, ())])
    assert index.expected_by_tier("w1", p, BLOCK) == (0, 0, 0)


def test_placement_weighs_a_host_hit_against_a_pool_hit_by_the_prefill_they_save():
    s = FairScheduler(SchedulerConfig(placement="prefix-affinity"))
    for wid in ("w0", "w1"):
        s.worker_join(wid, 10_000)
    p = prefix(1, 8)
    s.submit("seed", "alice", 16, 1, 0.0, prefix=prefix(9, 1), block_tokens=BLOCK)  # the index learns the stride
    assert len(s.assign(0.0)) == 1
    s.on_finish("seed", 1, "stop", 0.0)
    s.on_report("w0", {}, kv_events=[("stored", MEDIUM_GPU, p[:4])])
    s.on_report("w1", {}, kv_events=[("stored", MEDIUM_HOST, p[:8])])
    s.submit("next", "alice", 200, 4, 1.0, prefix=p, block_tokens=BLOCK)
    (a,) = s.assign(1.0)
    assert a.worker_id == "w1"  # 8 blocks from host memory save more than 4 in the pool
    assert a.request.cached == 8 * BLOCK


def test_a_waiting_request_that_extends_a_dispatched_one_is_homed_on_its_worker():
    c = Continuations()
    turn1 = Request("t1", "alice", 64, 4, 0.0, 0, 65)
    turn1.prefix = prefix(1, 4)
    turn2 = Request("t2", "alice", 96, 4, 0.0, 1, 97)
    turn2.prefix = prefix(1, 6)
    other = Request("o", "alice", 96, 4, 0.0, 2, 97)
    other.prefix = prefix(2, 6)
    for r in (turn1, turn2, other):
        c.wait(r)
    c.leave(turn1)
    c.dispatched(turn1, "w1")
    assert turn2.home == "w1" and not other.home
    assert list(c.homed("w1")) == [turn2]
    rebuilt = Continuations()
    rebuilt.restore(c.snapshot(), [turn2, other])  # beside the queues, after a restore
    assert list(rebuilt.homed("w1")) == [turn2] and rebuilt.next_homing == c.next_homing
    c.leave(turn2)
    assert list(c.homed("w1")) == [] and not c.homes


def test_the_locality_slack_sends_a_homed_turn_ahead_of_its_tenants_head_to_the_worker_holding_it():
    s = FairScheduler(SchedulerConfig(policy="vtc-locality:1000", placement="prefix-affinity", max_engine_waiting=1))
    s.worker_join("w", 100_000, max_running=1)
    s.submit("t1", "alice", 64, 1, 0.0, prefix=prefix(1, 4), block_tokens=BLOCK)
    assert [a.request.id for a in s.assign(0.0)] == ["t1"]
    for i in range(LOCAL_WINDOW + 4):  # more than the window over alice's queue: only its home finds t2
        s.submit(f"cold{i}", "alice", 64, 1, 0.5, prefix=prefix(10 + i, 4), block_tokens=BLOCK)
    s.submit("t2", "alice", 96, 1, 0.5, prefix=prefix(1, 6), block_tokens=BLOCK)  # extends t1: homed on w
    s.on_report("w", {"t1": 1}, started={"t1": 64}, cached={"t1": 0}, kv_events=[("stored", MEDIUM_GPU, prefix(1, 4))])
    s.on_finish("t1", 1, "stop", 1.0)
    first = s.assign(1.0)[0]
    assert first.request.id == "t2" and first.request.cached == 4 * BLOCK
