"""The worker replica as a Ray Serve deployment (one deployment per model pool): one engine runner,
its gRPC Worker server and its stream to its model's pool in the dispatcher. Serve adds and removes
replicas; a removed replica says goodbye, takes no new work and finishes what it runs before it stops
(``graceful_shutdown_timeout_s`` covers the longest generation)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ray import serve
from ray.exceptions import RayActorError

from fairgate.common.config import TelemetrySettings
from fairgate.common.loopback import bind_host
from fairgate.common.replica_rank import shard_of_replica
from fairgate.common.tracing import configure_tracing, finished_spans
from fairgate.dispatcher.actor import find_dispatcher
from fairgate.workers.engines import engine_for
from fairgate.workers.worker import Worker


@dataclass(frozen=True)
class WorkerStart:
    """What one pool's worker replicas are started with: the engine plug-in and its settings (checked by
    it), the telemetry section, the data plane's port (0: any free one) and the longest request frame."""

    engine: str
    settings: dict[str, Any]
    telemetry: TelemetrySettings
    port: int
    max_frame_bytes: int
    shards: int = 1  # the dispatcher's shards: a replica reports to shard (its rank modulo this)


@serve.deployment(
    ray_actor_options={"num_cpus": 0},
    graceful_shutdown_timeout_s=600,  # build_app sets workers.graceful_shutdown_s
    graceful_shutdown_wait_loop_s=0.5,
    max_ongoing_requests=16,
    logging_config={"enable_access_log": False, "log_level": "WARNING"},
)
class WorkerReplica:
    async def __init__(self, app: str, start: WorkerStart, secret: str, model: str | None = None) -> None:
        """The dispatcher is found by name, never created here: a worker is not given its settings."""
        configure_tracing(start.telemetry, "fairgate-worker")
        shard = shard_of_replica(start.shards)
        actor = await find_dispatcher(app, shard=shard)
        await actor.address.remote(model)

        async def locate() -> str:  # asked again after every lost stream: a restarted dispatcher moves
            nonlocal actor
            try:
                return await actor.address.remote(model)
            except RayActorError:  # gone for good: an ingress replica creates the next one
                actor = await find_dispatcher(app, shard=shard)
                return await actor.address.remote(model)

        worker_id = f"worker-{serve.get_replica_context().replica_id.unique_id}"
        runner = engine_for(start.engine).runner(start.settings, model)
        self.worker = Worker(
            worker_id,
            locate,
            secret.encode(),
            runner,
            host=bind_host(),
            port=start.port,
            max_frame_bytes=start.max_frame_bytes,
        )
        await self.worker.start()

    async def check_health(self) -> None:
        """Serve replaces a replica whose engine has died (its requests already ended with an error)."""
        if not self.worker.runner.healthy():
            raise RuntimeError(f"{self.worker.worker_id}: the engine has failed")

    async def info(self) -> dict[str, Any]:
        """Who this replica is; ``generated``: how many times each request id was generated here."""
        w = self.worker
        return {"worker_id": w.worker_id, "address": w.address, "pid": os.getpid(), "generated": dict(w.generated)}

    async def finished_spans(self) -> list[dict[str, Any]]:
        """Spans finished in this replica (telemetry traces: memory)."""
        return finished_spans()

    async def __del__(self) -> None:
        await self.worker.drain()
