"""Several dispatcher shards in virtual time (``fairgate bench shards``): with the rounds, the fleet keeps
the stated bound and a single dispatcher's throughput, a tenant whose requests reach one shard only
included; without them, that tenant gets only what its shard serves it."""

from __future__ import annotations

import pytest

from fairgate.loadgen.benches.shards import shard_row, threshold_rows
from fairgate.loadgen.simulator import SimulationConfig, simulate
from fairgate.loadgen.workloads import overload

ENGINES, SECONDS = 8, 120.0


@pytest.mark.parametrize(("workload", "shards", "tau_s"), [("skew", 2, 0.05), ("skew", 8, 0.2), ("on_off", 4, 0.01)])
def test_shards_keep_the_bound_jain_and_the_single_dispatcher_s_throughput(workload, shards, tau_s):
    single = shard_row(workload, ENGINES, 1, 1.0, SECONDS, seed=0)
    row = shard_row(workload, ENGINES, shards, tau_s, SECONDS, seed=0)
    assert row["inside_bound"], row
    assert row["jain"] >= 0.99
    assert row["throughput"] >= 0.98 * single["throughput"]
    if workload == "skew":
        assert row["moved"] > 0  # A's requests reached one shard: the others were dealt some


def test_without_rounds_a_tenant_reaching_one_shard_gets_only_that_shard_s_share():
    w = overload(0, scale=4).truncated(SECONDS)
    alone = simulate(w, SimulationConfig(replicas=4, shards=2, tau_s=1e9, pinned={"A": 0})).report
    service = {name: t["service"] for name, t in alone["tenants"].items()}
    assert service["A"] < 0.4 * service["B"]  # half of one shard of two: a quarter of the fleet
    assert not alone["bound_held"]


def test_the_threshold_rule_keeps_the_gap_from_growing_with_the_engines():
    """overload on 1 and 16 engines: without the rule the gap grows with the fleet (about 16x); with it,
    at 16 engines it stays within 2x one engine's without it, at the same throughput, the recomputed
    tokens reported and the stated bound (one engine's, plus twice the threshold) kept."""
    one, sixteen = threshold_rows((1, 16), 2500.0, 150.0, seed=0)
    assert sixteen["gap_rule_off"] > 8 * one["gap_rule_off"]
    assert sixteen["gap"] <= 2 * one["gap_rule_off"]
    assert sixteen["inside_bound"] and one["inside_bound"]
    assert sixteen["throughput_vs_rule_off"] >= 0.95
    assert sixteen["taken"] > 0 and sixteen["recomputed_tokens"] > 0
