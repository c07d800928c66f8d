"""Several dispatcher shards in virtual time (``fairgate bench shards``): with the rounds, the fleet keeps
the stated bound and a single dispatcher's throughput, a tenant whose requests reach one shard only
included; without them, that tenant gets only what its shard serves it."""

from __future__ import annotations

import pytest

from fairgate.loadgen.benches.shards import shard_row
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
