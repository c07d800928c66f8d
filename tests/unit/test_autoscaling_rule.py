"""The replica-count rule, the core's demand reading, and the autoscaling section of the configuration."""

from __future__ import annotations

import pytest

from fairgate.common.sections import ConfigError
from fairgate.core import Demand, FairScheduler, ReplicaCapacity, SchedulerConfig, desired_replicas
from fairgate.core.capacity import fleet_demand
from fairgate.gateway.config import parse_config
from fairgate.workers.autoscaling import DispatcherDemandPolicy


def demand(**kw) -> Demand:
    base = dict(
        queued_requests=0,
        queued_tokens=0,
        running_requests=0,
        committed_tokens=0,
        workers=1,
        pool_tokens=1000,
        max_running=0,
    )
    return Demand(**(base | kw))


def test_idle_needs_no_replica_and_load_needs_enough_at_the_target_utilisation():
    cap = ReplicaCapacity(kv_tokens=1000, target_utilization=0.5)
    assert desired_replicas(demand(), cap) == 0
    assert desired_replicas(demand(committed_tokens=500), cap) == 1
    assert desired_replicas(demand(committed_tokens=500, queued_tokens=1), cap) == 2
    assert desired_replicas(demand(committed_tokens=1000, queued_tokens=1000), cap) == 4


def test_request_counts_against_batch_limits_can_dominate():
    cap = ReplicaCapacity(kv_tokens=1000, max_running=4, target_utilization=1.0)
    assert desired_replicas(demand(running_requests=4, queued_requests=9, max_running=4), cap) == 4
    # with no replica yet, the configured capacity is used (scale from zero)
    assert desired_replicas(demand(workers=0, pool_tokens=0, queued_requests=5, queued_tokens=100), cap) == 2


def test_scheduler_demand_counts_queue_commitments_and_workers():
    s = FairScheduler(SchedulerConfig())
    s.worker_join("w0", 1000, max_running=8)
    s.worker_join("w1", 3000, max_running=4)
    for i in range(3):
        s.submit(f"r{i}", "A", 100, 50, 0.0)
    s.assign(0.0)
    s.submit("q", "B", 10, 20, 0.0)
    s.worker_drain("w1")
    d = s.demand()
    assert d.workers == 1 and d.pool_tokens == 1000 and d.max_running == 8
    assert d.running_requests == 3 and d.committed_tokens == 3 * 101  # assigned prompts, not started: KV they need
    assert d.queued_requests == 1 and d.queued_tokens == 30


class Ctx:
    target_num_replicas = 2
    capacity_adjusted_min_replicas = 1
    capacity_adjusted_max_replicas = 3


def test_policy_keeps_the_target_without_a_reading_and_bounds_its_answer():
    policy = DispatcherDemandPolicy("no-such-app", kv_tokens_per_replica=1000, poll_interval_s=60)
    assert policy(Ctx()) == (2, {})  # no dispatcher answered: no change
    policy._latest[:] = [(float("inf"), demand(queued_tokens=10_000))]
    replicas, state = policy(Ctx())
    assert replicas == 3 and state["fairgate_desired"] == 13
    policy._stop.set()


BASE = {"tenants": [{"name": "a", "api_key": "k" * 16}], "admin_api_key": "admin" * 4}


def test_autoscaling_section_parses_and_refuses_nonsense():
    config, _ = parse_config({**BASE, "workers": {"autoscaling": {"min_replicas": 0, "max_replicas": 3}}})
    a = config.workers.autoscaling
    assert a is not None and (a.min_replicas, a.max_replicas, a.upscale_delay_s) == (0, 3, 3.0)
    assert parse_config(BASE)[0].workers.autoscaling is None
    for bad in (
        {"max_replicas": 0},
        {"min_replicas": 3, "max_replicas": 2},
        {"target_utilization": 1.5},
        {"upscale_delay_s": -1},
        {"replicas": 2},
        "yes",
    ):
        with pytest.raises(ConfigError, match="autoscaling"):
            parse_config({**BASE, "workers": {"autoscaling": bad}})


def test_a_pool_split_over_dispatcher_shards_scales_on_the_demand_of_all_of_them():
    shards = [
        Demand(queued_requests=6, queued_tokens=3000, running_requests=4, committed_tokens=2000, workers=1,
               pool_tokens=4000, max_running=4),
        Demand(queued_requests=0, queued_tokens=0, running_requests=1, committed_tokens=500, workers=3,
               pool_tokens=2000, max_running=8),
    ]  # fmt: skip
    fleet = fleet_demand(shards)
    assert (fleet.queued_requests, fleet.running_requests, fleet.workers) == (6, 5, 4)
    assert (fleet.pool_tokens, fleet.max_running) == (2500, 4)
    capacity = ReplicaCapacity(4000, 4)
    assert desired_replicas(fleet, capacity) == 4  # (5 + 6) running and waiting, 4 at a time at 80%
    assert desired_replicas(shards[1], capacity) == 1  # one shard's reading alone would not scale up
    assert fleet_demand([]).workers == 0
