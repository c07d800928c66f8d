"""``fairgate bench locality`` on a slice of the real Mooncake trace: every arm, the ceiling above
every arm's hit rate, the fair arms inside their bound."""

from __future__ import annotations

from pathlib import Path

from loadgen.bench_locality import CEILING, bench_locality
from loadgen.mooncake import DEFAULT_SHARES, MOONCAKE_BLOCK_TOKENS, load_mooncake


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
        "prefix-blind VTC",
        "VTC + prefix placement",
        "vtc-locality:10000",
        "vtc-locality:100000",
        "affinity router (FCFS)",
        "FCFS",
        CEILING,
    }
    ceiling = rows[CEILING]["prefix_hit_rate"]
    assert all(row["prefix_hit_rate"] <= ceiling for row in rows.values())
    assert rows["VTC + prefix placement"]["prefix_hit_rate"] > rows["prefix-blind VTC"]["prefix_hit_rate"]
    assert all(row["bound_held"] for row in rows.values() if row["policy"].startswith("vtc"))
    assert r["ceiling_vs_blind"] >= 1.0 and r["hit_rate_vs_router"] > 1.0
