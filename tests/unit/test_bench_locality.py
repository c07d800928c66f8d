"""``fairgate bench locality`` on a slice of the real Mooncake trace: every arm, the tiers and the
engines' events in use, the fair arms inside their bound; the generated agent sessions."""

from __future__ import annotations

import itertools
from pathlib import Path

from fairgate.loadgen.agent_sessions import SYSTEM_TOKENS, agent_sessions
from fairgate.loadgen.benches.locality import BASELINE, BLIND, CEILING, bench_locality
from fairgate.loadgen.mooncake import DEFAULT_SHARES, MOONCAKE_BLOCK_TOKENS, load_mooncake


def test_the_trace_becomes_tenants_by_conversation_with_prefixes_salted_apart(mooncake_trace: Path):
    workload = load_mooncake(mooncake_trace, limit=400)
    assert {r.tenant for r in workload.requests} == set(DEFAULT_SHARES)
    by_tenant: dict[str, set[int]] = {}
    tenant_of_conversation: dict[int, str] = {}
    for r in workload.requests:
        assert len(r.prefix) == r.prompt_tokens // MOONCAKE_BLOCK_TOKENS  # full blocks only
        by_tenant.setdefault(r.tenant, set()).update(r.prefix)
        if len(r.prefix) > 1:
            conversation = r.prefix[1] & 0xFFFFFFFF  # the trace's own id, under the tenant's salt
            assert tenant_of_conversation.setdefault(conversation, r.tenant) == r.tenant
    blocks = list(by_tenant.values())
    assert all(not (a & b) for i, a in enumerate(blocks) for b in blocks[i + 1 :])  # no block shared across tenants


def test_every_arm_runs_and_the_ceiling_finds_the_most_cache(mooncake_trace: Path):
    r = bench_locality(mooncake_trace, time_scale=6.0, limit=1500, replicas=2, slacks=(10_000.0, 100_000.0))
    rows = {row["arm"]: row for row in r["rows"]}
    assert set(rows) == {
        BASELINE,
        BLIND,
        "VTC + prefix placement",
        "vtc-locality:10000",
        "vtc-locality:100000",
        "affinity router (FCFS)",
        "FCFS",
        CEILING,
    }
    # on GPU-only engines the ceiling finds the most (arms that pick cached requests first serve a
    # different subset of a short slice, so their rates are not comparable with it here)
    assert rows[CEILING]["prefix_hit_rate"] >= rows[BASELINE]["prefix_hit_rate"]
    assert rows[BLIND]["prefix_hit_rate"] > rows[BASELINE]["prefix_hit_rate"]  # the tiers find more
    assert rows["vtc-locality:100000"]["prefix_hit_rate"] > rows[BLIND]["prefix_hit_rate"]
    assert rows[BASELINE]["loaded_from_tiers"] == 0.0 and rows[BLIND]["loaded_from_tiers"] > 0.0
    # the arms that see prefixes index the engines' events, and the engines confirm most expectations
    assert all(rows[a]["index_agreement"] > 0.5 for a in ("VTC + prefix placement", "vtc-locality:100000"))
    assert rows[BLIND]["index_agreement"] is None
    assert r["fair_arms_bound_held"] and all(
        row["bound_held"] for row in rows.values() if row["policy"].startswith("vtc")
    )
    assert r["ceiling_vs_blind"] >= 1.0 and r["hit_rate_vs_router"] > 1.0
    assert r["share_of_ceiling_gain"] is not None and r["vs_blind_on_tiers"] > 0


def test_agent_sessions_chain_their_turns_and_share_a_system_prompt_per_tenant():
    workload = agent_sessions(limit=2_000)
    assert {r.tenant for r in workload.requests} == set(DEFAULT_SHARES)
    system = SYSTEM_TOKENS // MOONCAKE_BLOCK_TOKENS
    firsts = {r.tenant: r.prefix[:system] for r in workload.requests}
    assert all(r.prefix[:system] == firsts[r.tenant] for r in workload.requests)  # one system prompt per tenant
    assert len(set(firsts.values())) == len(firsts)  # salted apart
    by_session: dict[int, list] = {}
    for r in workload.requests:
        assert len(r.prefix) == r.prompt_tokens // MOONCAKE_BLOCK_TOKENS
        if len(r.prefix) > system:
            by_session.setdefault(r.prefix[system], []).append(r)
    chained = 0
    for turns in by_session.values():
        for earlier, later in itertools.pairwise(turns):
            assert later.prompt_tokens > earlier.prompt_tokens and later.arrival_s >= earlier.arrival_s
            assert later.prefix[: len(earlier.prefix)] == earlier.prefix  # a turn extends the one before
            chained += 1
    assert chained > len(by_session)  # sessions of several turns
    assert agent_sessions(limit=50).requests == agent_sessions(limit=50).requests  # seeded
