"""Several dispatcher shards in virtual time (``fairgate bench shards``): with the rounds, the fleet keeps
the stated bound and a single dispatcher's throughput, a tenant whose requests reach one shard only
included; without them, that tenant gets only what its shard serves it."""

from __future__ import annotations

import pytest

from fairgate.loadgen.benches.shards import shard_row, threshold_rows
from fairgate.loadgen.simulator import SimulationConfig, simulate
from fairgate.loadgen.workload_spec import workload_from_spec
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


def test_a_tenant_tree_keeps_its_bound_across_shards():
    """Two organisations (weights 1 and 2) of two tenants each, every tenant overloading, over four
    engines and two shards, a1's requests reaching shard 0 only: the tree nodes' figures go through
    the rounds as the tenants' do, every pair of backlogged siblings, at each level, stays inside the
    fleet's bound, and a1 is served as its sibling is (without the rounds: about half as much)."""
    spec = {
        "duration_s": 90,
        "tree": [{"name": "org-a", "weight": 1}, {"name": "org-b", "weight": 2}],
        "tenants": [
            {"name": n, "parent": org, "rate": rate, "prompt_len": 200, "output_len": [50, 300], "arrival": "poisson"}
            for n, org, rate in (("a1", "org-a", 3), ("a2", "org-a", 3), ("b1", "org-b", 3), ("b2", "org-b", 3))
        ],
    }
    w = workload_from_spec(spec, seed=0, scale=4)
    report = simulate(w, SimulationConfig(replicas=4, shards=2, tau_s=0.05, pinned={"a1": 0})).report
    assert report["bound_held"], (report["max_abs_service_diff"], report["bound_2u"])
    served = {name: t["service"] for name, t in report["tenants"].items()}
    assert served["b1"] + served["b2"] > 1.5 * (served["a1"] + served["a2"])  # org-b's weight 2
    assert served["a1"] > 0.9 * served["a2"]
