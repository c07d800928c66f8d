"""Who the tenants are: names, API key hashes, weights, their place in the tenant tree and the request
classes each may use, changed live through the admin API.

It lives in the dispatcher actor (one authority for every ingress replica) next to the schedulers,
which hold each tenant's and node's weight and counters. Only keyed hashes of keys are kept
(``common/key_hashing``). Every change is checked whole before it counts: the tree it would make is
built once by the core (its own checks name a cycle, an unknown parent or a bad weight), so a refused
change changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fairgate.common.tenant_schema import MAX_GROUP_CHARS
from fairgate.core import make_policy
from fairgate.core.classes import RequestClass, default_class
from fairgate.core.tree import TreeError, check_tree, parents_first
from fairgate.core.weights import weight_problem

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # the whole name (fullmatch: "$" lets "\n" end it)
AUTO_TIERS = ("", "auto")  # what a client sends for "the key's default class"


class TenantError(ValueError):
    """An admin change that cannot be made; ``status`` is the HTTP status it maps to."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class TenantRecord:
    name: str
    key_hash: str
    weight: float = 1.0
    cache_group: str = ""  # shares cached prefixes with the tenants of this group ("": with no one)
    parent: str = ""  # its tree node ("": the root)
    classes: list[str] = field(default_factory=list)  # request classes it may use ([]: every one not strict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class NodeRecord:
    name: str
    parent: str = ""
    weight: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ServiceClass:
    """A request class as clients name it: OpenAI's ``service_tier`` (``tier``) or the class's name."""

    spec: RequestClass
    tier: str


class TenantRegistry:
    def __init__(
        self,
        records: list[dict[str, Any]],
        nodes: list[dict[str, Any]] | None = None,
        classes: Iterable[ServiceClass] = (),
        policy: str = "vtc",
    ) -> None:
        self._policy = make_policy(policy)  # whether a tree can be ordered (FairnessPolicy.tree)
        self._by_name: dict[str, TenantRecord] = {}
        self._by_hash: dict[str, str] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.classes = {c.spec.name: c for c in classes}
        self._by_tier = {c.tier: c.spec.name for c in self.classes.values()}
        self.default_class = default_class(c.spec for c in self.classes.values())
        for n in nodes or ():
            self.nodes[n["name"]] = NodeRecord(n["name"], str(n.get("parent") or ""), float(n.get("weight", 1.0)))
        for r in records:
            record = TenantRecord(
                r["name"],
                r["key_hash"],
                float(r.get("weight", 1.0)),
                str(r.get("cache_group") or ""),
                str(r.get("parent") or ""),
                list(r.get("classes") or ()),
            )
            self._by_name[record.name] = record
            self._by_hash[record.key_hash] = record.name
        self._check(self.nodes, self._by_name.values())

    def lookup(self, key_hash: str) -> str | None:
        return self._by_hash.get(key_hash)

    def get(self, name: str) -> TenantRecord | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return list(self._by_name)

    def records(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self._by_name.values()]

    def node_records(self) -> list[dict[str, Any]]:
        return [n.to_dict() for n in self.nodes.values()]

    def ancestry(self, tenant: str) -> list[str]:
        """The tenant's name, its tree nodes up to the root, and the root ("")."""
        names = [tenant]
        record = self._by_name.get(tenant)
        parent = record.parent if record is not None else ""
        while parent and parent not in names:
            names.append(parent)
            node = self.nodes.get(parent)
            parent = node.parent if node is not None else ""
        return [*names, ""]

    def known(self, name: str) -> bool:
        """Whether ``name`` is a tree node or a tenant."""
        return name in self.nodes or name in self._by_name

    def tree_order(self) -> list[tuple[str, str, float]]:
        """The nodes as (name, parent, weight), parents first: the order to create them in."""
        return parents_first({n.name: (n.parent, n.weight) for n in self.nodes.values()})

    # ------------------------------------------------------------------ request classes

    def class_for(self, tenant: str, tier: str | None) -> tuple[str, str]:
        """(class, tier served) for a request of ``tenant`` naming ``tier`` (OpenAI's service_tier, or
        a class name; None / "auto": the tenant's default). 400 for a class this key may not use."""
        if not self.classes:  # one tier: a request naming another is refused, as OpenAI refuses one
            if tier in (None, *AUTO_TIERS, "default"):
                return "", ""
            raise TenantError(400, f"service_tier {tier!r} is not available: this gateway serves auto or default")
        record = self._require(tenant)
        allowed = record.classes or [n for n, c in self.classes.items() if not c.spec.strict]
        if tier in (None, *AUTO_TIERS):
            name = allowed[0]
        else:
            name = self._by_tier.get(tier, tier if tier in self.classes else "")
            if name not in allowed:
                tiers = ", ".join(self.classes[n].tier for n in allowed)
                raise TenantError(400, f"service_tier {tier!r} is not available to this key; it may use: {tiers}")
        return ("" if name == self.default_class else name), self.classes[name].tier

    # ------------------------------------------------------------------ tenants

    def create(
        self,
        name: str,
        key_hash: str,
        weight: float,
        cache_group: str = "",
        parent: str = "",
        classes: list[str] | None = None,
    ) -> TenantRecord:
        if not _NAME.fullmatch(name or ""):
            raise TenantError(400, "tenant names are 1-64 letters, digits, '_', '.', '-', starting alphanumeric")
        _check_weight(weight)
        _check_group(cache_group)
        if name in self._by_name:
            raise TenantError(409, f"tenant {name!r} already exists")
        if key_hash in self._by_hash:
            raise TenantError(409, "that API key belongs to another tenant")
        record = TenantRecord(name, key_hash, weight, cache_group, parent, self._check_classes(classes or []))
        self._check(self.nodes, [*self._by_name.values(), record])
        self._by_name[name] = record
        self._by_hash[key_hash] = name
        return record

    def update(
        self,
        name: str,
        weight: float | None = None,
        key_hash: str | None = None,
        cache_group: str | None = None,
        parent: str | None = None,
        classes: list[str] | None = None,
    ) -> TenantRecord:
        record = self._require(name)
        if cache_group is not None:
            _check_group(cache_group)
        if weight is not None:
            _check_weight(weight)
        if key_hash is not None and key_hash != record.key_hash and key_hash in self._by_hash:
            raise TenantError(409, "that API key belongs to another tenant")
        changed = TenantRecord(**record.to_dict())
        changed.parent = record.parent if parent is None else parent
        changed.classes = record.classes if classes is None else self._check_classes(classes)
        changed.weight = record.weight if weight is None else weight
        self._check(self.nodes, [r for r in self._by_name.values() if r is not record] + [changed])
        record.parent, record.classes, record.weight = changed.parent, changed.classes, changed.weight
        if cache_group is not None:
            record.cache_group = cache_group
        if key_hash is not None and key_hash != record.key_hash:
            del self._by_hash[record.key_hash]
            record.key_hash = key_hash
            self._by_hash[key_hash] = name
        return record

    def delete(self, name: str) -> None:
        record = self._require(name)
        del self._by_name[name]
        del self._by_hash[record.key_hash]

    # ------------------------------------------------------------------ tree nodes

    def set_node(self, name: str, parent: str | None, weight: float | None, creating: bool) -> NodeRecord:
        """Create a node (``creating``) or move / reweight one; checked whole first."""
        if not _NAME.fullmatch(name or ""):
            raise TenantError(400, "node names are 1-64 letters, digits, '_', '.', '-', starting alphanumeric")
        if weight is not None:
            _check_weight(weight)
        old = self.nodes.get(name)
        if creating and old is not None:
            raise TenantError(409, f"node {name!r} already exists")
        if creating and name in self._by_name:
            raise TenantError(409, f"{name!r} is a tenant; a node needs a name of its own")
        if not creating and old is None:
            raise TenantError(404, f"no node {name!r}")
        base = old or NodeRecord(name)
        changed = NodeRecord(name, base.parent if parent is None else parent, base.weight if weight is None else weight)
        self._check({**self.nodes, name: changed}, self._by_name.values())
        self.nodes[name] = changed
        return changed

    def delete_node(self, name: str) -> None:
        if name not in self.nodes:
            raise TenantError(404, f"no node {name!r}")
        members = [n for n, r in self.nodes.items() if r.parent == name]
        members += [n for n, r in self._by_name.items() if r.parent == name]
        if members:
            raise TenantError(
                409, f"node {name!r} still has members ({', '.join(sorted(members)[:5])}): move them first"
            )
        del self.nodes[name]

    # ------------------------------------------------------------------ checks

    def _check(self, nodes: Mapping[str, NodeRecord], records: Iterable[TenantRecord]) -> None:
        """The tree these records make, built once by the core apart: its own checks."""
        if not self._policy.tree and (nodes or any(r.parent for r in records)):
            message = f"a tenant tree needs a policy that orders by counters; this gateway's is {self._policy.name!r}"
            raise TenantError(400, message)
        try:
            check_tree(
                {n.name: (n.parent, n.weight) for n in nodes.values()}, ((r.name, r.parent, r.weight) for r in records)
            )
        except TreeError as exc:
            raise TenantError(400, str(exc)) from None

    def _check_classes(self, classes: Any) -> list[str]:
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise TenantError(400, "classes must be a list of request class names")
        unknown = [c for c in classes if c not in self.classes]
        if unknown:
            known = ", ".join(self.classes) or "none are configured"
            raise TenantError(400, f"no request class {unknown[0]!r} (the classes: {known})")
        return list(dict.fromkeys(classes))

    def _require(self, name: str) -> TenantRecord:
        record = self._by_name.get(name)
        if record is None:
            raise TenantError(404, f"no tenant {name!r}")
        return record


def _check_group(group: str) -> None:
    if not isinstance(group, str) or len(group) > MAX_GROUP_CHARS:
        raise TenantError(400, f"cache_group must be a name of at most {MAX_GROUP_CHARS} characters, got {group!r}")


def _check_weight(weight: float) -> None:
    if problem := weight_problem(weight):
        raise TenantError(400, problem)
