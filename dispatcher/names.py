"""The Ray actor names of an app's dispatcher shards and of their rounds' runner (namespace
``fairgate``): how ingress replicas, workers and the runner find them; and the node they run on."""

from __future__ import annotations

import os

# A Ray custom resource that only the node meant for the dispatcher has (on Kubernetes: the head pod,
# the one that may reach Redis and mounts the tenants' Secret); unset: any node.
DISPATCHER_RESOURCE_ENV = "FAIRGATE_DISPATCHER_RESOURCE"


def dispatcher_resources() -> dict[str, float] | None:
    """What the dispatcher's actors (its shards and their runner) ask of a node."""
    resource = os.environ.get(DISPATCHER_RESOURCE_ENV)
    return {resource: 0.001} if resource else None


def dispatcher_name(app: str, shard: int = 0) -> str:
    """Shard 0 keeps the one-dispatcher name."""
    return f"fairgate-dispatcher-{app}" + (f"-{shard}" if shard else "")


def rounds_name(app: str) -> str:
    return f"fairgate-shard-rounds-{app}"
