"""The Ray actor names of an app's dispatcher shards and of their rounds' runner (namespace
``fairgate``): how ingress replicas, workers and the runner find them."""

from __future__ import annotations


def dispatcher_name(app: str, shard: int = 0) -> str:
    """Shard 0 keeps the one-dispatcher name."""
    return f"fairgate-dispatcher-{app}" + (f"-{shard}" if shard else "")


def rounds_name(app: str) -> str:
    return f"fairgate-shard-rounds-{app}"
