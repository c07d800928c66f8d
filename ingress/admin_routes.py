"""The admin API (admin key only): tenants, the tenant tree's nodes and LoRA adapters, listed, created,
changed and deleted in the dispatcher's registries, and its stats. A part of ``Ingress`` (``ingress/deployment.py``)."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from fairgate.common.openai_errors import ApiError
from fairgate.ingress.admin_api import TenantChange, adapter_change, node_change, tenant_change


def _raise_error(result: dict[str, Any]) -> None:
    """An admin change the dispatcher refused, as the client's error."""
    if "error" in result:
        status, message = result["error"]
        raise ApiError(status, message, code={404: "not_found", 409: "conflict"}.get(status, "invalid_request"))


class AdminRoutes:
    """``/admin/tenants``, ``/admin/nodes`` and ``/admin/adapters``, and ``/admin/stats``."""

    async def admin_list(self, request: Request) -> dict[str, Any]:
        await self._admin(request)
        return {"object": "list", "data": await self._dispatcher.list_tenants()}

    async def admin_create(self, request: Request) -> dict[str, Any]:
        await self._admin(request)
        change = tenant_change(await self._json_body(request), creating=True)
        row = await self._change("create", change.name or "", change)
        return {**row, "api_key": change.api_key}  # shown once: only its hash is kept

    async def admin_update(self, name: str, request: Request) -> dict[str, Any]:
        await self._admin(request)
        return await self._change("update", name, tenant_change(await self._json_body(request), creating=False))

    async def admin_delete(self, name: str, request: Request) -> dict[str, Any]:
        await self._admin(request)
        return await self._change("delete", name, None)

    async def admin_nodes(self, request: Request) -> dict[str, Any]:
        """The tenant tree's nodes (organisations, teams) with their weights and counters."""
        await self._admin(request)
        return {"object": "list", "data": await self._dispatcher.list_nodes()}

    async def admin_create_node(self, request: Request) -> dict[str, Any]:
        await self._admin(request)
        name, parent, weight = node_change(await self._json_body(request), creating=True)
        return await self._change_node("create", name or "", parent or "", weight)

    async def admin_update_node(self, name: str, request: Request) -> dict[str, Any]:
        await self._admin(request)
        _, parent, weight = node_change(await self._json_body(request), creating=False)
        return await self._change_node("update", name, parent, weight)

    async def admin_delete_node(self, name: str, request: Request) -> dict[str, Any]:
        await self._admin(request)
        return await self._change_node("delete", name, None, None)

    async def admin_adapters(self, request: Request) -> dict[str, Any]:
        """The LoRA adapters: name, base model, where the weights are, who may use them."""
        await self._admin(request)
        return {"object": "list", "data": await self._dispatcher.list_adapters()}

    async def admin_create_adapter(self, request: Request) -> dict[str, Any]:
        await self._admin(request)
        c = adapter_change(await self._json_body(request), creating=True)
        return await self._change_adapter("create", c.name or "", c.base_model, c.path, c.nodes)

    async def admin_update_adapter(self, name: str, request: Request) -> dict[str, Any]:
        await self._admin(request)
        c = adapter_change(await self._json_body(request), creating=False)
        return await self._change_adapter("update", name, None, c.path, c.nodes)

    async def admin_delete_adapter(self, name: str, request: Request) -> dict[str, Any]:
        await self._admin(request)
        return await self._change_adapter("delete", name, None, None, None)

    async def admin_usage(self, request: Request) -> dict[str, Any]:
        """Every token quota: used, held, left and when its window turns."""
        await self._admin(request)
        return {"object": "list", "data": await self._dispatcher.usage(None)}

    async def admin_stats(self, request: Request) -> dict[str, Any]:
        await self._admin(request)
        return await self._dispatcher.stats()

    async def _change(self, action: str, name: str, change: TenantChange | None) -> dict[str, Any]:
        c = change or TenantChange(None, None, None, None, None, None)
        key_hash = None if c.api_key is None else self._hasher.of_key(c.api_key)
        result = await self._dispatcher.change_tenant(
            action, name, key_hash, c.weight, c.cache_group, c.parent, c.classes
        )
        _raise_error(result)
        if action == "delete" or key_hash is not None:  # its old key is refused here from now on
            self._keys.forget_tenant(name)
        if key_hash is not None:  # its new key is known here at once, whatever floods the look-ups
            self._keys.put(key_hash, name)
        return result

    async def _change_adapter(
        self, action: str, name: str, base_model: str | None, path: str | None, nodes: list[str] | None
    ) -> dict[str, Any]:
        result = await self._dispatcher.change_adapter(action, name, base_model, path, nodes)
        _raise_error(result)
        self._pools.forget_adapters()  # this replica's tenants see the change at once; others within seconds
        return result

    async def _change_node(self, action: str, name: str, parent: str | None, weight: float | None) -> dict[str, Any]:
        result = await self._dispatcher.change_node(action, name, parent, weight)
        _raise_error(result)
        return result
