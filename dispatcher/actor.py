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
from dispatcher.tenant_registry import TenantError, TenantRegistry

MAX_PENDING_CALLS = 100_000


@ray.remote(num_cpus=0)
class DispatcherActor:
    def __init__(self, scheduler: dict[str, Any], tenants: list[dict[str, Any]], secret: str) -> None:
        self._service = DispatcherService(SchedulerConfig.from_dict(scheduler), secret.encode())
        self._registry = TenantRegistry(tenants)
        for t in tenants:
            self._service.scheduler.add_tenant(t["name"], float(t.get("weight", 1.0)))
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

    # ------------------------------------------------------------------ tenants (ingress and admin API)

    async def lookup_key(self, key_hash: str) -> str | None:
        """The tenant owning an API key's hash, or None."""
        return self._registry.lookup(key_hash)

    async def list_tenants(self) -> list[dict[str, Any]]:
        """Every tenant with its weight, counter, exact service and queue (never a key or its hash)."""
        counters = self._service.scheduler.stats()["tenants"]
        return [
            {"name": name, **counters.get(name, {"weight": self._registry.get(name).weight})}
            for name in self._registry.names()
        ]

    async def change_tenant(self, action: str, name: str, key_hash: str | None = None, weight: float | None = None):
        """create / update / delete; returns the tenant's row, or {"error": (status, message)}."""
        try:
            if action == "create":
                self._registry.create(name, key_hash or "", 1.0 if weight is None else weight)
            elif action == "update":
                self._registry.update(name, weight=weight, key_hash=key_hash)
            elif action == "delete":
                self._registry.delete(name)  # its counters stay: re-creating the name gains no credit
                return {"name": name, "deleted": True}
            else:
                raise TenantError(400, f"unknown action {action!r}")
        except TenantError as exc:
            return {"error": [exc.status, str(exc)]}
        record = self._registry.get(name)
        self._service.scheduler.add_tenant(name, record.weight)  # the next dispatch uses the new weight
        return next(row for row in await self.list_tenants() if row["name"] == name)


def dispatcher_name(app: str) -> str:
    return f"fairgate-dispatcher-{app}"


def get_or_create_dispatcher(app: str, scheduler: dict[str, Any], tenants: list[dict[str, Any]], secret: str):
    return DispatcherActor.options(
        name=dispatcher_name(app),
        namespace="fairgate",
        get_if_exists=True,
        lifetime="detached",
        max_concurrency=MAX_PENDING_CALLS,
    ).remote(scheduler, tenants, secret)
