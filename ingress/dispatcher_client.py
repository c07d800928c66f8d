"""The ingress's typed calls to the dispatcher actor (everything but admission, which has an endpoint of
its own: ``ingress/admission_client.py``). Each call waits out a dispatcher restart (up to ``wait_s``)
and asks again; cancelling a call cancels it at the dispatcher. With dispatcher shards, reads go to
shard 0 (every shard holds the fleet's counters, a round late at most), changes of tenants, nodes
and adapters to every shard (each keeps its own registry), shard 0 first."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError

from fairgate.ingress.errors import rejection_error

log = logging.getLogger(__name__)


class DispatcherClient:
    """One method per dispatcher call the ingress makes, with its arguments typed."""

    def __init__(self, actors: Sequence[Any], wait_s: float) -> None:
        """``actors``: the dispatcher's shards, in order (one without shards)."""
        self._shards = list(actors)
        self._actor = self._shards[0]
        self._wait_s = wait_s

    @property
    def shards(self) -> int:
        return len(self._shards)

    async def admission_address(self, shard: int = 0) -> str:
        actor = self._shards[shard]
        return await self._call(lambda: actor.admission_address.remote())

    async def telemetry(self, series_s: float = 0.0) -> dict[str, Any]:
        """Figures for /metrics and the live page (``series_s``: that much history for its charts)."""
        return await self._call(lambda: self._actor.telemetry.remote(series_s))

    async def lookup_key(self, key_hash: str) -> str | None:
        return await self._call(lambda: self._actor.lookup_key.remote(key_hash))

    async def list_tenants(self) -> list[dict[str, Any]]:
        return await self._call(lambda: self._actor.list_tenants.remote())

    async def list_nodes(self) -> list[dict[str, Any]]:
        return await self._call(lambda: self._actor.list_nodes.remote())

    async def usage(self, tenant: str | None) -> list[dict[str, Any]]:
        return await self._call(lambda: self._actor.usage.remote(tenant))

    async def stats(self) -> dict[str, Any]:
        return await self._call(lambda: self._actor.stats.remote())

    async def change_tenant(
        self,
        action: str,
        name: str,
        key_hash: str | None,
        weight: float | None,
        cache_group: str | None,
        parent: str | None,
        classes: list[str] | None,
    ) -> dict[str, Any]:
        """create / update / delete; the tenant's row, or ``{"error": (status, message)}``."""
        return await self._everywhere(
            lambda a: a.change_tenant.remote(action, name, key_hash, weight, cache_group, parent, classes)
        )

    async def change_node(self, action: str, name: str, parent: str | None, weight: float | None) -> dict[str, Any]:
        return await self._everywhere(lambda a: a.change_node.remote(action, name, parent, weight))

    async def adapters_for(self, tenant: str) -> list[dict[str, str]]:
        """The adapters ``tenant`` may use: {name, base_model} each."""
        return await self._call(lambda: self._actor.adapters_for.remote(tenant))

    async def list_adapters(self) -> list[dict[str, Any]]:
        return await self._call(lambda: self._actor.list_adapters.remote())

    async def change_adapter(
        self, action: str, name: str, base_model: str | None, path: str | None, nodes: list[str] | None
    ) -> dict[str, Any]:
        """create / update / delete; the adapter's row, or ``{"error": (status, message)}``."""
        return await self._everywhere(lambda a: a.change_adapter.remote(action, name, base_model, path, nodes))

    def release(self, request_id: str, model: str, shard: int = 0) -> None:
        """Free the assignment of a request given up before its worker sent anything (not awaited: it
        may run while the client leaves); ``shard``: the one that placed it."""
        self._shards[shard].release.remote(request_id, model)

    async def _everywhere(self, send: Callable[[Any], Any]) -> dict[str, Any]:
        """A change, made by shard 0 (its answer is the caller's), then by every other shard once it
        was accepted there."""
        result = await self._call(lambda: send(self._actor))
        if "error" not in result:
            others = await asyncio.gather(*(self._call(lambda a=a: send(a)) for a in self._shards[1:]))
            for shard, other in enumerate(others, start=1):
                if "error" in other:  # it lacks the change until it reloads the store
                    log.warning("dispatcher shard %d did not take a change: %s", shard, other["error"])
        return result

    async def _call(self, send: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s
        delay = 0.1
        while True:
            ref = send()
            try:
                return await ref
            except asyncio.CancelledError:
                ray.cancel(ref)
                raise
            except RayActorError:
                if loop.time() >= deadline:
                    raise rejection_error("dispatcher_unavailable") from None
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)
