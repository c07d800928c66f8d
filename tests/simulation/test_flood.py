"""A KV-bound flood in virtual time (``fairgate bench flood``): fairgate keeps the engine as busy as a
fairness-blind round-robin front does (the engine's own admission), while the light tenant gets its
share and the backlogged gap stays inside the stated bound; preemption by the dispatcher's ranks
gives the light tenant a shorter first-token time than the engine's newest-first rule; with both tenants
keeping more outstanding than the engine runs at once, the default gives the light one its share."""

from __future__ import annotations

import pytest

from fairgate.loadgen.benches.flood import ARMS, HEAVY, LIGHT, bench_flood, ratio_to_round_robin

DEFAULT = ARMS[3]
assert DEFAULT.revoke and DEFAULT.preempt_by == "priority"  # the deployment's defaults


@pytest.fixture(scope="module")
def rows():
    return {(r["replicas"], r["arm"]): r for r in bench_flood(seconds=150.0, replicas=(1, 4))}


@pytest.fixture(scope="module")
def both_above():
    """4:1 outstanding, each more than one engine runs at once (about 18 of these requests)."""
    loops = {HEAVY: 96, LIGHT: 24}
    return {r["arm"]: r for r in bench_flood(seconds=150.0, replicas=(1,), outstanding=loops)}


def test_by_default_the_light_tenant_gets_its_share_of_one_engine_at_round_robins_throughput(both_above):
    blind, default = both_above[ARMS[0].name], both_above[DEFAULT.name]
    assert blind["light_over_heavy"] < 0.3  # round robin: service follows what each keeps outstanding
    assert default["light_over_heavy"] >= 0.9, default["light_over_heavy"]
    assert default["throughput_tokens_per_s"] >= 0.95 * blind["throughput_tokens_per_s"]
    assert default["bound_held"]


def test_fairgate_keeps_the_round_robin_fronts_throughput_on_one_and_four_engines(rows):
    ratios = ratio_to_round_robin(list(rows.values()))
    for n in (1, 4):
        for arm in ARMS[1:]:
            assert ratios[(n, arm.name)] >= 0.95, (n, arm.name, ratios[(n, arm.name)])


def test_the_light_tenant_gets_its_share_inside_the_bound(rows):
    blind = rows[(1, ARMS[0].name)]
    assert blind["share"][LIGHT] < 0.25  # round robin: shares follow what each keeps outstanding (8 : 32)
    for arm in ARMS[1:]:
        r = rows[(1, arm.name)]
        assert r["bound_held"] and r["max_backlogged_gap"] <= r["bound"]
        assert r["share"][LIGHT] > 1.5 * blind["share"][LIGHT]
        assert r["preemptions"] > 0  # the engine over-commits and preempts, as it does alone
    by_rank, newest = rows[(1, ARMS[2].name)], rows[(1, ARMS[1].name)]
    assert by_rank["light_mean_ttft_s"] < newest["light_mean_ttft_s"] < blind["light_mean_ttft_s"]
    assert by_rank["share"][HEAVY] + by_rank["share"][LIGHT] == pytest.approx(1.0)


def test_a_burst_on_engines_with_room_is_spread_so_the_light_tenant_waits_no_longer_than_behind_round_robin(rows):
    """Four engines with room to spare: the finishes of a step come back together, and their successors
    are placed by the prefill each engine already has for its next step, not all on the emptiest."""
    blind = rows[(4, ARMS[0].name)]
    for arm in ARMS[1:]:
        r = rows[(4, arm.name)]
        assert r["light_p50_ttft_s"] <= blind["light_p50_ttft_s"], (arm.name, r["light_p50_ttft_s"])
        assert r["light_p99_ttft_s"] <= blind["light_p99_ttft_s"], (arm.name, r["light_p99_ttft_s"])
        assert r["throughput_tokens_per_s"] >= 0.99 * blind["throughput_tokens_per_s"]
