"""The models behind one endpoint: each a pool of worker replicas with its own engine, its own
dispatcher pool (fairness is kept per pool) and, when configured, the tenants that may use it; and the
LoRA adapters on them, each a model name of its own (vLLM's convention). A model a tenant may not use
answers exactly as one that does not exist (OpenAI's 404 ``model_not_found``), so no tenant learns what
others are served."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fairgate.common.config import GatewayConfig
from fairgate.common.openai_errors import ApiError
from fairgate.ingress.prompting import Prompting

ADAPTERS_FRESH_S = 2.0  # how long a tenant's adapter list is used before the dispatcher is asked again
ADAPTERS_KEPT = 10_000  # tenants whose lists are kept (more: the oldest are dropped)

AdapterLister = Callable[[str], Awaitable[list[dict[str, str]]]]


@dataclass
class Pool:
    name: str
    prompting: Prompting
    tenants: frozenset[str] | None  # None: every tenant

    def allows(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants

    def card(self) -> dict[str, Any]:
        return {"id": self.name, "object": "model", "created": 0, "owned_by": "fairgate"}


@dataclass(frozen=True, slots=True)
class Served:
    """What a request's ``model`` names: its pool, and the adapter on it ("": the base model)."""

    pool: Pool
    adapter: str = ""

    @property
    def model(self) -> str:
        return self.adapter or self.pool.name


class ModelPools:
    def __init__(self, config: GatewayConfig, adapters_of: AdapterLister | None = None) -> None:
        """``adapters_of``: the adapters a tenant may use (the dispatcher's registry), asked at most
        every ``ADAPTERS_FRESH_S`` per tenant; the dispatcher checks each request's again."""
        self._pools: dict[str, Pool] = {}
        for m in config.models:
            tenants = None if m.tenants is None else frozenset(m.tenants)
            self._pools[m.name] = Pool(m.name, Prompting(config.ingress, m.workers, m.name), tenants)
        self._adapters_of = adapters_of
        self._fresh: dict[str, tuple[float, dict[str, str]]] = {}  # tenant -> (when asked, adapter -> base)

    def pool(self, model: str, tenant: str) -> Pool:
        """The pool serving ``model`` (a base model) for ``tenant``; 404 when there is none it may use."""
        pool = self._pools.get(model)
        if pool is None or not pool.allows(tenant):
            raise not_found(model)
        return pool

    async def served(self, model: str, tenant: str) -> Served:
        """What ``model`` names for ``tenant``: a base model, or an adapter it may use on one."""
        if model in self._pools:
            return Served(self.pool(model, tenant))
        base = (await self._adapters(tenant)).get(model)
        if base is None or base not in self._pools or not self._pools[base].allows(tenant):
            raise not_found(model)
        return Served(self._pools[base], model)

    async def listing(self, tenant: str) -> list[dict[str, Any]]:
        """The base models and adapters ``tenant`` may use, as OpenAI's model cards (an adapter's
        ``parent`` is its base model, as vLLM lists them)."""
        cards = [p.card() for p in self._pools.values() if p.allows(tenant)]
        for name, base in (await self._adapters(tenant)).items():
            if base in self._pools and self._pools[base].allows(tenant):
                cards.append({**self._pools[base].card(), "id": name, "root": base, "parent": base})
        return cards

    async def card(self, model: str, tenant: str) -> dict[str, Any]:
        """One model's card; 404 as for a request when ``tenant`` may not use it."""
        wanted = (await self.served(model, tenant)).model
        cards = await self.listing(tenant)
        return next(c for c in cards if c["id"] == wanted)

    async def _adapters(self, tenant: str) -> dict[str, str]:
        if self._adapters_of is None:
            return {}
        now = time.monotonic()
        known = self._fresh.get(tenant)
        if known is not None and now - known[0] < ADAPTERS_FRESH_S:
            return known[1]
        adapters = {a["name"]: a["base_model"] for a in await self._adapters_of(tenant)}
        if len(self._fresh) >= ADAPTERS_KEPT:
            self._fresh.pop(next(iter(self._fresh)))
        self._fresh.pop(tenant, None)
        self._fresh[tenant] = (now, adapters)
        return adapters

    def forget_adapters(self) -> None:
        """An adapter changed through this replica: every tenant's list is asked again."""
        self._fresh.clear()


def not_found(model: str) -> ApiError:
    return ApiError(404, f"the model '{model}' does not exist", param="model", code="model_not_found")
