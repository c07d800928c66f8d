"""Cache-aware dispatch in the pure core and the engine model (docs/architecture.md): the prefix index, the
engine's prefix cache, cached tokens charged at w_c and corrected by the engine's count, placement by
cached prefix, and the locality slack."""

from __future__ import annotations

import pytest

from fairgate.core import FairScheduler, LinearCost, SchedulerConfig, make_policy
from fairgate.core.costs import ProfiledCost, cost_from_spec
from fairgate.core.prefix_index import PrefixIndex
from fairgate.loadgen.simulator import Simulation, SimulationConfig
from fairgate.workers.engines.simulated import EngineRequest, SimulatedEngine, StepTimeModel
from tests.unit.simulated_runs import workload_of

BLOCK = 16


def prefix(conversation: int, blocks: int) -> tuple[int, ...]:
    return tuple(conversation * 1000 + i for i in range(blocks))


def run_engine(engine: SimulatedEngine) -> tuple[dict[str, int], dict[str, int]]:
    started: dict[str, int] = {}
    cached: dict[str, int] = {}
    while engine.has_work():
        engine.begin_step()
        report = engine.end_step()
        started |= report.started
        cached |= report.cached
    return started, cached


# ----------------------------------------------------------------------------- the engine model


def test_the_engine_shares_cached_blocks_skips_their_prefill_and_evicts_least_recently_used():
    step = StepTimeModel(0.0, 1.0, 0.0, 0.0)  # a step costs its prefilled tokens: skipped prefill shows
    engine = SimulatedEngine(320, step, block_size=BLOCK, prefix_caching=True)
    engine.add(EngineRequest("a", 100, 4, 4, prefix=prefix(1, 6), prefix_block=BLOCK))
    assert engine.begin_step() == 100  # nothing cached yet: the whole prompt
    engine.end_step()
    run_engine(engine)
    assert engine.used_blocks == 0 and engine.evictable_blocks == 6  # its 6 full blocks stay, as free room
    assert engine.free_tokens == 320
    engine.add(EngineRequest("b", 100, 4, 4, prefix=prefix(1, 4) + prefix(2, 2)[:2], prefix_block=BLOCK))
    assert engine.begin_step() == 100 - 4 * BLOCK  # 4 leading blocks are shared
    report = engine.end_step()
    assert report.cached == {"b": 64}
    run_engine(engine)
    # a request needing the whole pool evicts what no one holds, least recently used first
    engine.add(EngineRequest("c", 300, 4, 4))
    started, cached = run_engine(engine)
    assert started == {"c": 300} and cached == {"c": 0}
    assert engine.evictable_blocks < 8


def test_a_fully_cached_prompt_still_computes_its_last_token_and_identical_salted_prompts_do_not_share():
    engine = SimulatedEngine(1000, StepTimeModel.zero(), block_size=BLOCK, prefix_caching=True)
    engine.add(EngineRequest("a", 64, 2, 2, prefix=prefix(1, 4), prefix_block=BLOCK))
    run_engine(engine)
    engine.add(EngineRequest("again", 64, 2, 2, prefix=prefix(1, 4), prefix_block=BLOCK))
    engine.add(EngineRequest("other-tenant", 64, 2, 2, prefix=prefix(9, 4), prefix_block=BLOCK))  # salted apart
    _, cached = run_engine(engine)
    assert cached == {"again": 63, "other-tenant": 0}


def test_without_prefix_caching_nothing_is_cached():
    engine = SimulatedEngine(1000, StepTimeModel.zero(), block_size=BLOCK)
    for rid in ("a", "b"):
        engine.add(EngineRequest(rid, 64, 2, 2, prefix=prefix(1, 4), prefix_block=BLOCK))
        assert run_engine(engine)[1] == {rid: 0}


def test_the_ideal_cache_shares_every_prefilled_block_across_engines_in_no_memory():
    ideal: set[int] = set()
    a, b = (SimulatedEngine(200, StepTimeModel(0.0, 1.0, 0.0, 0.0), block_size=BLOCK, ideal_cache=ideal) for _ in "ab")
    a.add(EngineRequest("first", 96, 2, 2, prefix=prefix(1, 6), prefix_block=BLOCK))
    assert a.begin_step() == 96
    a.end_step()
    run_engine(a)
    b.add(EngineRequest("next-turn", 160, 2, 2, prefix=prefix(1, 6) + prefix(7, 4), prefix_block=BLOCK))
    assert b.begin_step() == 160 - 96  # the other engine's blocks, skipped
    report = b.end_step()
    assert report.cached == {"next-turn": 96}
    assert b.used_blocks == -(-161 // BLOCK)  # the whole context is still allocated: the ceiling takes no room
    run_engine(b)
    a.add(EngineRequest("cut", 160, 2, 2, prefix=prefix(1, 2) + prefix(8, 8), prefix_block=BLOCK))
    assert run_engine(a)[1] == {"cut": 32}  # only the leading blocks count


def test_the_ceiling_arm_gains_at_least_what_cache_aware_dispatch_gains():
    rows = [(t, 0.05 * i, 160 + 16 * (i % 3), 40) for i in range(120) for t in (0, 1, 2)]
    hits = {}  # a pool that holds well under what runs at once: where placement decides hits
    for name, config in {
        "blind": SimulationConfig(sees_prefix=False, replicas=2, kv_tokens=500, drain=True),
        "aware": SimulationConfig(placement="prefix-affinity", replicas=2, kv_tokens=500, drain=True),
        "ceiling": SimulationConfig(sees_prefix=False, replicas=2, kv_tokens=500, drain=True, ideal_cache=True),
    }.items():
        sim = Simulation(workload_of(rows, prefixed=True), config)
        sim.advance(float("inf"))
        hits[name] = sim.summary().report["prefix_hit_rate"]
    assert hits["ceiling"] >= hits["aware"] > hits["blind"]


# ----------------------------------------------------------------------------- the prefix index


def test_the_index_is_bounded_by_the_pool_and_shrinks_when_the_engine_finds_less_than_expected():
    index = PrefixIndex()
    index.join("w", pool_tokens=10 * BLOCK)
    index.dispatched("w", prefix(1, 8), BLOCK)
    assert index.expected_tokens("w", prefix(1, 8), BLOCK) == 8 * BLOCK
    index.dispatched("w", prefix(2, 8), BLOCK)  # 16 blocks do not fit in 10: the oldest go, chains from their ends
    assert index.expected_tokens("w", prefix(1, 8), BLOCK) == 2 * BLOCK
    assert index.expected_tokens("w", prefix(2, 8), BLOCK) == 8 * BLOCK
    before = index.stats()["w"]["capacity"]
    index.observed("w", expected=8 * BLOCK, exact=2 * BLOCK)
    assert index.stats()["w"]["capacity"] < before
    assert index.expected_tokens("other", prefix(2, 8), BLOCK) == 0


# ----------------------------------------------------------------------------- cost and charges


def test_cached_tokens_cost_w_c_and_the_engines_exact_count_corrects_the_expectation():
    cost = LinearCost(1.0, 2.0, 0.1)
    s = FairScheduler(SchedulerConfig(cost=cost, placement="prefix-affinity"))
    s.worker_join("w", 10_000)
    s.submit("first", "alice", 160, 10, 0.0, prefix=prefix(1, 10), block_tokens=BLOCK)
    (a,) = s.assign(0.0)
    assert a.request.cached == 0  # nothing known yet: charged in full
    s.on_report("w", {"first": 1}, started={"first": 160}, cached={"first": 0})
    s.on_finish("first", 10, "stop", 1.0)
    counter = s.tenants["alice"].counter
    s.submit("next", "alice", 160, 10, 1.0, prefix=prefix(1, 10), block_tokens=BLOCK)
    (b,) = s.assign(1.0)
    assert b.request.cached == 159  # expected: the whole prompt but its last token
    assert s.tenants["alice"].counter - counter == pytest.approx(0.1 * 159 + 1.0)
    s.on_report("w", {"next": 1}, started={"next": 160}, cached={"next": 96})  # the engine found less
    assert b.request.cached == 96
    assert s.tenants["alice"].counter - counter == pytest.approx(0.1 * 96 + 64 + 2.0)
    s.on_finish("next", 10, "stop", 2.0)
    t = s.tenants["alice"]
    assert t.service == pytest.approx(cost.total(160, 10) * 2 - 0.9 * 96)


def test_a_refund_gives_back_the_discount_too():
    s = FairScheduler(SchedulerConfig(cost=LinearCost(1.0, 2.0, 0.0)))
    s.worker_join("w", 10_000)
    for rid in ("a", "b"):
        s.submit(rid, "alice", 64, 4, 0.0, prefix=prefix(1, 4), block_tokens=BLOCK)
        s.assign(0.0)
    assert s.in_flight()["b"].cached == 63
    s.on_finish("b", 0, "abort", 0.0)  # never started: everything refunded, the discount included
    s.on_finish("a", 0, "abort", 0.0)
    assert s.tenants["alice"].counter == pytest.approx(0.0) and s.tenants["alice"].service == pytest.approx(0.0)


def test_cost_specs_carry_the_cached_price_and_refuse_a_price_above_a_computed_token():
    assert cost_from_spec(LinearCost(1.0, 2.0, 0.25).spec()) == LinearCost(1.0, 2.0, 0.25)
    assert LinearCost().w_c == pytest.approx(0.1)
    profiled = cost_from_spec(ProfiledCost(cached_fraction=0.5).spec())
    assert profiled.cached_discount(100) == pytest.approx(0.5 * profiled.a * 100)
    with pytest.raises(ValueError, match="w_c"):
        LinearCost(1.0, 2.0, 1.5)
    with pytest.raises(ValueError, match="cached_fraction"):
        ProfiledCost(cached_fraction=2.0)


# ----------------------------------------------------------------------------- placement and order


def test_prefix_affinity_sends_a_conversations_next_turn_to_the_worker_holding_its_prefix():
    s = FairScheduler(SchedulerConfig(placement="prefix-affinity"))
    for wid in ("w0", "w1", "w2"):
        s.worker_join(wid, 10_000)
    placed = {}
    for turn in range(3):  # the three conversations run side by side, turn after turn
        used = dict.fromkeys(("w0", "w1", "w2"), 0)
        for conversation in (1, 2, 3):
            rid = f"c{conversation}-t{turn}"
            blocks = prefix(conversation, 4 + 2 * turn)
            s.submit(rid, "alice", 64 + 32 * turn, 4, 0.0, prefix=blocks, block_tokens=BLOCK)
            (a,) = s.assign(0.0)
            placed[rid] = a.worker_id
            used[a.worker_id] += a.request.prompt_tokens + 1
            started, cached = {rid: a.request.prompt_tokens}, {rid: a.request.cached}
            s.on_report(a.worker_id, {rid: 1}, started=started, cached=cached, free_tokens=10_000 - used[a.worker_id])
        for conversation in (1, 2, 3):
            s.on_finish(f"c{conversation}-t{turn}", 4, "stop", 0.0)
    for conversation in (1, 2, 3):
        assert len({placed[f"c{conversation}-t{t}"] for t in range(3)}) == 1
    assert len({placed[f"c{c}-t0"] for c in (1, 2, 3)}) == 3  # spread while nothing is cached


def test_locality_slack_serves_a_cached_prefix_first_within_delta_and_plain_vtc_at_zero():
    def first_served(policy: str) -> str:
        s = FairScheduler(SchedulerConfig(policy=policy, placement="prefix-affinity", max_engine_waiting=1))
        s.worker_join("w", 10_000, max_running=1)
        s.submit("warm", "bob", 64, 1, 0.0, prefix=prefix(7, 4), block_tokens=BLOCK)
        s.assign(0.0)
        s.on_report("w", {"warm": 1}, started={"warm": 64}, cached={"warm": 0})
        s.on_finish("warm", 1, "stop", 0.0)
        s.submit("a", "alice", 64, 1, 1.0, prefix=prefix(8, 4), block_tokens=BLOCK)
        s.tenants["bob"].counter = s.tenants["alice"].counter + 50  # bob is ahead by 50
        s.submit("b", "bob", 64, 1, 1.0, prefix=prefix(7, 4), block_tokens=BLOCK)
        return s.assign(1.0)[0].request.id

    assert first_served("vtc-locality:0") == "a"
    assert first_served("vtc") == "a"
    assert first_served("vtc-locality:100") == "b"  # within Δ: the cached prefix goes first
    assert first_served("vtc-locality:10") == "a"  # beyond Δ: the least-served goes first
    assert make_policy("vtc-locality:100").bound(1000.0) == 2100.0


def test_locality_slack_raises_the_hit_rate_and_keeps_the_bound_in_the_simulator():
    rows = [(t, 0.05 * i, 160 + 16 * (i % 3), 40) for i in range(120) for t in (0, 1, 2)]
    workload = workload_of(rows, prefixed=True)
    reports = {}
    for policy in ("vtc", "vtc-locality:5000"):
        config = SimulationConfig(policy=policy, placement="prefix-affinity", replicas=2, kv_tokens=1200, drain=True)
        sim = Simulation(workload_of(rows, prefixed=True), config)
        sim.advance(float("inf"))
        reports[policy] = sim.summary().report
    assert reports["vtc-locality:5000"]["prefix_hit_rate"] >= reports["vtc"]["prefix_hit_rate"]
    assert all(r["bound_held"] for r in reports.values())
    blind = Simulation(workload, SimulationConfig(sees_prefix=False, replicas=2, kv_tokens=1200, drain=True))
    blind.advance(float("inf"))
    assert blind.summary().report["prefix_hit_rate"] > 0  # the engines cache even when the dispatcher is blind
