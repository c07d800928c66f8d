"""The models behind one endpoint: each a pool of worker replicas with its own engine, its own
dispatcher pool (fairness is kept per pool) and, when configured, the tenants that may use it. A model
a tenant may not use answers exactly as one that does not exist (OpenAI's 404 ``model_not_found``), so
no tenant learns what others are served."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.openai_errors import ApiError
from ingress.prompting import Prompting


@dataclass
class Pool:
    name: str
    prompting: Prompting
    tenants: frozenset[str] | None  # None: every tenant

    def allows(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants

    def card(self) -> dict[str, Any]:
        return {"id": self.name, "object": "model", "created": 0, "owned_by": "fairgate"}


class ModelPools:
    def __init__(self, gateway: dict[str, Any]) -> None:
        self._pools: dict[str, Pool] = {}
        for m in gateway["models"]:
            tenants = None if m.get("tenants") is None else frozenset(m["tenants"])
            self._pools[m["name"]] = Pool(m["name"], Prompting(gateway, m["workers"], m["name"]), tenants)

    def pool(self, model: str, tenant: str) -> Pool:
        """The pool serving ``model`` for ``tenant``; 404 when there is none it may use."""
        pool = self._pools.get(model)
        if pool is None or not pool.allows(tenant):
            raise ApiError(404, f"the model '{model}' does not exist", param="model", code="model_not_found")
        return pool

    def listing(self, tenant: str) -> list[dict[str, Any]]:
        return [p.card() for p in self._pools.values() if p.allows(tenant)]
