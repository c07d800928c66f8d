"""The dispatcher as one named async Ray actor: a thin shell over ``DispatcherService``.

Every queued request is one pending ``submit`` call on this actor, so ``max_concurrency`` is far above
the largest queue accepted. Whoever needs the dispatcher first (ingress or worker replica) creates it;
the others find it by name.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray

from dispatcher.core import SchedulerConfig
from dispatcher.service import DispatcherService, Rejected

MAX_PENDING_CALLS = 100_000


@ray.remote(num_cpus=0)
class DispatcherActor:
    def __init__(self, scheduler: dict[str, Any], tenants: list[tuple[str, float]], secret: str) -> None:
        self._service = DispatcherService(SchedulerConfig.from_dict(scheduler), secret.encode())
        for name, weight in tenants:
            self._service.scheduler.add_tenant(name, weight)
        self._started: asyncio.Task[str] | None = None

    async def address(self) -> str:
        """The Dispatcher gRPC service's address (started on first use, on loopback)."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_task(self._service.start("127.0.0.1", 0))
        return await self._started

    async def submit(self, request_id: str, tenant: str, prompt_tokens: int, max_tokens: int) -> dict[str, Any]:
        """Resolves when the request is assigned: where to run it and the signed ticket."""
        await self.address()
        try:
            p = await self._service.submit(request_id, tenant, prompt_tokens, max_tokens)
        except Rejected as exc:
            return {"rejected": exc.reason}
        t = p.ticket
        return {
            "worker_id": p.worker_id,
            "address": p.address,
            "ticket": {
                "request_id": t.request_id,
                "tenant": t.tenant,
                "worker_id": t.worker_id,
                "expires_at": t.expires_at,
            },
            "signature": p.signature,
        }

    async def abort(self, request_id: str) -> None:
        self._service.abort(request_id)

    async def drain(self, worker_id: str) -> None:
        self._service.drain(worker_id)

    async def stats(self) -> dict[str, Any]:
        return self._service.stats()


def dispatcher_name(app: str) -> str:
    return f"fairgate-dispatcher-{app}"


def get_or_create_dispatcher(app: str, scheduler: dict[str, Any], tenants: list[tuple[str, float]], secret: str):
    return DispatcherActor.options(
        name=dispatcher_name(app),
        namespace="fairgate",
        get_if_exists=True,
        lifetime="detached",
        max_concurrency=MAX_PENDING_CALLS,
    ).remote(scheduler, tenants, secret)
