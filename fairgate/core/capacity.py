"""How many worker replicas the dispatcher's demand calls for (pure; the autoscaling policy's rule).

Requests wait in the dispatcher, not at the replicas, so Serve's own queue-length signal never sees
them. Demand here is what the dispatcher knows: KV tokens the engines use now (and the prompts assigned
to them that have not started), KV tokens the waiting requests may reach (prompt plus ``max_tokens``),
and request counts against each replica's batch
limit. The replica count is the larger of the two needs at a target utilisation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Demand:
    """The dispatcher's load at one moment (``FairScheduler.demand``)."""

    queued_requests: int
    queued_tokens: int  # KV tokens the waiting requests may reach (prompt plus max_tokens)
    running_requests: int
    committed_tokens: int  # KV tokens the workers use now, and the prompts assigned there not yet started
    workers: int  # workers taking work (not draining)
    pool_tokens: int  # mean KV pool of those workers (0: none yet)
    max_running: int  # the smallest batch limit among them (0: none or no limit)


def fleet_demand(shards: Sequence[Demand]) -> Demand:
    """The demand of a pool whose workers are split over dispatcher shards: loads add up, the pool is
    the workers' mean, the batch limit the smallest any shard knows."""
    workers = sum(d.workers for d in shards)
    limits = [d.max_running for d in shards if d.max_running]
    return Demand(
        queued_requests=sum(d.queued_requests for d in shards),
        queued_tokens=sum(d.queued_tokens for d in shards),
        running_requests=sum(d.running_requests for d in shards),
        committed_tokens=sum(d.committed_tokens for d in shards),
        workers=workers,
        pool_tokens=round(sum(d.pool_tokens * d.workers for d in shards) / workers) if workers else 0,
        max_running=min(limits, default=0),
    )


@dataclass(frozen=True, slots=True)
class ReplicaCapacity:
    """What one replica can hold, used until replicas report their own (scale from zero)."""

    kv_tokens: int
    max_running: int | None = None
    target_utilization: float = 0.8

    def __post_init__(self) -> None:
        if self.kv_tokens <= 0 or not 0 < self.target_utilization <= 1:
            raise ValueError("kv_tokens must be positive and target_utilization in (0, 1]")


def desired_replicas(demand: Demand, capacity: ReplicaCapacity) -> int:
    """Replicas needed so that everything running and waiting fits at the target utilisation."""
    pool = demand.pool_tokens or capacity.kv_tokens
    by_tokens = (demand.committed_tokens + demand.queued_tokens) / (pool * capacity.target_utilization)
    slots = demand.max_running or capacity.max_running or 0
    by_count = 0.0
    if slots:
        by_count = (demand.running_requests + demand.queued_requests) / (slots * capacity.target_utilization)
    return math.ceil(max(by_tokens, by_count) - 1e-9)
