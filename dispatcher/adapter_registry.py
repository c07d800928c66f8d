"""Which LoRA adapters the gateway serves, and who may use each: registered in the configuration and
through the admin API, kept in the state store beside the tenants.

An adapter is a model name (vLLM's convention): a request whose ``model`` names it runs on its base
model's pool with the adapter's weights. ``nodes`` are the tenant tree's nodes (or tenants) whose
tenants may use it ("" : every tenant); anyone else is answered as if it did not exist. Every change is
checked whole before it counts, so a refused change changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from fairgate.dispatcher.tenant_registry import TenantError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")  # as model names go: "acme/support-v2"
MAX_PATH_CHARS = 4096


@dataclass
class AdapterRecord:
    name: str
    base_model: str
    path: str  # where a worker reads its weights (a directory with adapter_config.json)
    nodes: list[str] = field(default_factory=list)  # tree nodes or tenants that may use it ("": all)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class AdapterRegistry:
    def __init__(self, records: Iterable[dict[str, Any]], models: dict[str, bool]) -> None:
        """``models``: each model pool's name, and whether its workers have adapter slots."""
        self._models = models
        self._by_name: dict[str, AdapterRecord] = {}
        for r in records:
            record = AdapterRecord(r["name"], r["base_model"], r["path"], list(r.get("nodes") or ()))
            self._by_name[record.name] = record

    def get(self, name: str) -> AdapterRecord | None:
        return self._by_name.get(name)

    def records(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self._by_name.values()]

    def usable_by(self, ancestry: Iterable[str]) -> list[AdapterRecord]:
        """The adapters a tenant may use, given its name and its tree nodes up to the root ("")."""
        reach = set(ancestry)
        return [r for r in self._by_name.values() if reach.intersection(r.nodes)]

    def create(self, record: AdapterRecord, known_node: Callable[[str], bool]) -> AdapterRecord:
        if record.name in self._by_name:
            raise TenantError(409, f"an adapter named {record.name!r} already exists")
        if record.name in self._models:
            raise TenantError(409, f"{record.name!r} is a model's name; an adapter needs a name of its own")
        self._check(record, known_node)
        self._by_name[record.name] = record
        return record

    def update(
        self, name: str, path: str | None, nodes: list[str] | None, known_node: Callable[[str], bool]
    ) -> AdapterRecord:
        record = self._require(name)
        changed = AdapterRecord(
            name, record.base_model, record.path if path is None else path, record.nodes if nodes is None else nodes
        )
        self._check(changed, known_node)
        self._by_name[name] = changed
        return changed

    def delete(self, name: str) -> None:
        self._require(name)
        del self._by_name[name]

    def _check(self, record: AdapterRecord, known_node: Callable[[str], bool]) -> None:
        if not _NAME.fullmatch(record.name or ""):
            raise TenantError(400, "adapter names are 1-128 letters, digits, '_', '.', ':', '/', '-'")
        if record.base_model not in self._models:
            known = ", ".join(self._models)
            raise TenantError(400, f"no model {record.base_model!r} to base the adapter on (the models: {known})")
        if not self._models[record.base_model]:
            raise TenantError(
                400, f"the workers of {record.base_model!r} have no adapter slots: set max_loras in its settings"
            )
        if not isinstance(record.path, str) or not 0 < len(record.path) <= MAX_PATH_CHARS:
            raise TenantError(400, f"path must be where the weights are, 1-{MAX_PATH_CHARS} characters")
        if not record.nodes:
            raise TenantError(400, "nodes must list the tree nodes or tenants that may use it ('' : every tenant)")
        unknown = [n for n in record.nodes if n and not known_node(n)]
        if unknown:
            raise TenantError(400, f"no tree node or tenant {unknown[0]!r}")
        record.nodes = list(dict.fromkeys(record.nodes))

    def _require(self, name: str) -> AdapterRecord:
        record = self._by_name.get(name)
        if record is None:
            raise TenantError(404, f"no adapter {name!r}")
        return record
