"""The dispatcher actor's calls about LoRA adapters: what a tenant may use (the ingress's model list
and its check of a request's model), and the admin API's changes, saved to the state store before
they count. A part of ``DispatcherActor`` (``dispatcher/actor.py``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fairgate.dispatcher.adapter_registry import AdapterRecord, AdapterRegistry
from fairgate.dispatcher.service import DispatcherService
from fairgate.dispatcher.state_store import StateStore
from fairgate.dispatcher.tenant_registry import TenantError, TenantRegistry

log = logging.getLogger(__name__)


class AdapterCalls:
    _adapters: AdapterRegistry
    _adapter_models: dict[str, bool]
    _registry: TenantRegistry
    _store: StateStore | None
    _changing: asyncio.Lock
    _pools: dict[str, DispatcherService]

    async def _ready(self) -> str: ...

    def _load_adapters(self, records: list[dict[str, Any]]) -> None:
        self._adapters = AdapterRegistry(records, self._adapter_models)
        self._publish_paths()

    def _publish_paths(self) -> None:
        """Each pool's tickets name where its adapters' weights are."""
        rows = self._adapters.records()
        for model, service in self._pools.items():
            service.adapter_paths = {r["name"]: r["path"] for r in rows if r["base_model"] == model}

    def adapter_for(self, tenant: str, model: str) -> AdapterRecord | None:
        """The adapter ``model`` names, when ``tenant`` may use it."""
        record = self._adapters.get(model)
        if record is None or not set(self._registry.ancestry(tenant)).intersection(record.nodes):
            return None
        return record

    async def adapters_for(self, tenant: str) -> list[dict[str, str]]:
        """The adapters ``tenant`` may use, each as {name, base_model} (never where its weights are)."""
        await self._ready()
        usable = self._adapters.usable_by(self._registry.ancestry(tenant))
        return [{"name": r.name, "base_model": r.base_model} for r in usable]

    async def list_adapters(self) -> list[dict[str, Any]]:
        await self._ready()
        return self._adapters.records()

    async def change_adapter(
        self,
        action: str,
        name: str,
        base_model: str | None = None,
        path: str | None = None,
        nodes: list[str] | None = None,
    ) -> dict[str, Any]:
        """create / update (path, nodes) / delete, saved to the store before it counts; returns the
        adapter's row, or {"error": (status, message)}. Requests already admitted keep their adapter."""
        await self._ready()
        assert self._store is not None
        async with self._changing:
            before = self._adapters.records()
            try:
                if action == "create":
                    record = AdapterRecord(name, base_model or "", path or "", list(nodes or ()))
                    self._adapters.create(record, self._registry.known)
                    await self._store.put_adapter(record.to_dict())
                elif action == "update":
                    record = self._adapters.update(name, path, nodes, self._registry.known)
                    await self._store.put_adapter(record.to_dict())
                elif action == "delete":
                    self._adapters.delete(name)
                    await self._store.delete_adapter(name)
                else:
                    raise TenantError(400, f"unknown action {action!r}")
            except TenantError as exc:
                return {"error": [exc.status, str(exc)]}
            except Exception as exc:  # the store failed: the change does not happen
                self._adapters = AdapterRegistry(before, self._adapter_models)
                log.warning("dispatcher: could not save an adapter change: %s", exc)
                return {"error": [503, "the adapter change could not be saved; retry later"]}
            self._publish_paths()
        if action == "delete":
            return {"name": name, "deleted": True}
        return record.to_dict()
