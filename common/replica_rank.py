"""Which dispatcher shard a Serve replica works with: its rank among its deployment's replicas (Serve
numbers them 0..n-1 and gives a replacement the rank of the replica it replaces), modulo the shards.
So ingress replicas, and each pool's workers, spread evenly over the shards."""

from __future__ import annotations

from ray import serve
from ray.serve.exceptions import RayServeException


def replica_rank() -> int:
    """This replica's rank (0 outside a Serve replica: a test building one by hand)."""
    try:
        context = serve.get_replica_context()
    except RayServeException:
        return 0
    rank = getattr(context, "rank", None)
    return int(rank.rank) if rank is not None else 0


def shard_of_replica(shards: int) -> int:
    return replica_rank() % max(1, shards)
