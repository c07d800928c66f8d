"""The scheduler's tenants: registering and weighting them, the tree nodes above them, and the leaves
their request classes queue in (docs/architecture.md). Kept apart because it changes who is compared
with whom, never what is charged."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fairgate.core.classes import RequestClass, default_class, leaf_name
from fairgate.core.in_flight import InFlight
from fairgate.core.model import Tenant
from fairgate.core.policies import FairnessPolicy
from fairgate.core.tree import CLASS_SEP, ROOT, SPARE, STRICT, TenantTree, TreeError, TreeNode
from fairgate.core.weights import weight_problem


class TenantBook:
    """Tenants (the leaves, with their queues and counters), the tree above them and the request
    classes their leaves stand for; the policy's key orders them."""

    __slots__ = ("_in_flight", "classes", "default_class", "key", "policy", "tenants", "tree")

    def __init__(self, policy: FairnessPolicy, classes: Sequence[RequestClass], in_flight: InFlight) -> None:
        self.policy = policy
        self.tenants: dict[str, Tenant] = {}
        self.key = policy.key_function(self.tenants)
        self.tree = TenantTree(self.tenants, self.key, policy.rejoin)
        self.classes: dict[str, RequestClass] = {c.name: c for c in classes}
        self.default_class = default_class(classes)
        self._in_flight = in_flight  # a tenant's own node takes over its requests' charges: their paths

    # ------------------------------------------------------------------ tenants and nodes

    def add_tenant(self, name: str, weight: float = 1.0, parent: str | None = None) -> Tenant:
        """Register a tenant (or change its weight, and with ``parent`` move it under that tree node;
        None: where it is, the root for a new one); takes effect on the next dispatch. A tenant with
        request classes is weighted (and moved) as its own node."""
        if problem := weight_problem(weight):
            raise ValueError(f"tenant {name!r}: {problem}")
        if parent and not self.policy.tree:
            raise ValueError(f"a tenant tree needs a policy that orders by counters, not {self.policy.name!r}")
        tenant = self.tenants.get(name)
        if tenant is None:
            if name in self.tree.nodes:
                raise TreeError(f"{name!r} is a tree node; a tenant needs a name of its own")
            tenant = Tenant(name, float(weight))
            self.tree.attach(tenant, parent or ROOT)  # refuses an unknown parent before anything changes
            self.tenants[name] = tenant
            return tenant
        if self.class_node(tenant) is not None:
            self.tree.set_node(name, parent, float(weight))
            return tenant
        if parent is not None and parent != tenant.parent:
            self.tree.move(tenant, parent)
        before = self.key_if_waiting(tenant)
        tenant.weight = float(weight)
        self.rekey_if_lower(tenant, before)
        return tenant

    def set_node(self, name: str, parent: str | None = None, weight: float | None = None) -> TreeNode:
        """Create a tree node under ``parent`` (None: the root), or move and reweight one; takes effect
        on the next dispatch. Raises ``TreeError`` for a cycle, an unknown parent or a weight <= 0."""
        if not self.policy.tree:
            raise ValueError(f"a tenant tree needs a policy that orders by counters, not {self.policy.name!r}")
        return self.tree.set_node(name, parent, weight)

    def delete_node(self, name: str) -> None:
        """Remove an empty tree node (its past service stays counted in the nodes above it)."""
        node = self.tree.node(name)
        if node.implicit:
            raise TreeError(f"{name!r} is a tenant's own node (its request classes)")
        self.tree.delete_node(name)

    def class_leaf(self, tenant: str, klass: str = "") -> Tenant:
        """The leaf that queues ``tenant``'s requests of class ``klass`` ("" or the default class: the
        tenant's own), created on first use under the tenant's own node (a strict class: in the
        strict band). Raises ValueError for an unknown class."""
        t = self.tenants.get(tenant) or self.add_tenant(tenant)
        name = leaf_name(tenant, klass, self.default_class)
        if name == tenant:
            return t
        spec = self.classes.get(klass)
        if spec is None:
            raise ValueError(f"unknown request class {klass!r}")
        leaf = self.tenants.get(name)
        if leaf is None:
            parent = STRICT if spec.strict else self._own_node(t).name
            leaf = Tenant(name, spec.weight)
            self.tree.attach(leaf, parent)
            self.tenants[name] = leaf
        return leaf

    def spare_leaf(self, tenant: str) -> Tenant:
        """The leaf that queues ``tenant``'s requests over a demoting quota, in the spare band (served
        only when no one else waits), created on first use."""
        name = f"{tenant}{CLASS_SEP}{SPARE}"
        leaf = self.tenants.get(name)
        if leaf is None:
            leaf = Tenant(name, 1.0)
            self.tree.attach(leaf, SPARE)
            self.tenants[name] = leaf
        return leaf

    def leaf_named(self, name: str) -> Tenant:
        """The leaf of that name, made as a tenant's class leaf when it names one (``tenant~class``)."""
        tenant, sep, klass = name.partition(CLASS_SEP)
        if sep and klass in self.classes:
            return self.class_leaf(tenant, klass)
        return self.add_tenant(name)

    def class_node(self, t: Tenant) -> TreeNode | None:
        """The tenant's own node (its request classes), if it has one."""
        node = self.tree.nodes.get(t.parent) if t.parent == t.name else None
        return node if node is not None and node.implicit else None

    def _own_node(self, t: Tenant) -> TreeNode:
        """The tenant's own node (its request classes), made on first use: it takes the tenant's place,
        weight and counter; the tenant, now its default class, is weighted as that class."""
        own = self.class_node(t)
        if own is not None:
            return own
        spec = self.classes.get(self.default_class)
        own = self.tree.split(t, spec.weight if spec is not None else 1.0)
        for req in self._in_flight:  # the node took over their charges: their refunds go there too
            if req.tenant == t.name:
                req.path = ((own.name, req.weight), *req.path)
        return own

    # ------------------------------------------------------------------ classes

    def class_of(self, leaf: str) -> str:
        """The request class a leaf queues (its tenant's default one for the tenant's own leaf)."""
        return leaf.partition(CLASS_SEP)[2] or self.default_class

    def class_spec(self, t: Tenant) -> RequestClass | None:
        """The class ``t`` is a leaf of (None: no classes, or a spare leaf, which is no class's)."""
        return None if t.parent == SPARE else self.classes.get(self.class_of(t.name))

    def queued_of(self, t: Tenant) -> int:
        """Requests waiting for ``t``'s key: all its fair classes together (a second class is no second cap)."""
        node = self.tree.nodes.get(t.parent)
        if node is None or not node.implicit:
            return len(t.queue)
        return sum(len(leaf.queue) for leaf in node.kids.values() if isinstance(leaf, Tenant))

    # ------------------------------------------------------------------ quotas' names

    def quota_names(self, t: Tenant) -> list[str]:
        """The names quotas can be set on for ``t``'s requests (any class's, or demoted): its tenant's and
        its tree nodes' (a tenant with classes has a node of its own name: once)."""
        owner = self.tenants.get(t.name.partition(CLASS_SEP)[0], t)
        return list(dict.fromkeys([owner.name, *(node.name for node in owner.ancestors)]))

    def quota_path(self, name: str) -> list[str]:
        """A tenant or tree node and the nodes above it, nearest first (where its quota sits)."""
        t = self.tenants.get(name)
        if t is not None:
            return self.quota_names(t)
        path, node = [], self.tree.nodes.get(name)
        while node is not None:
            path.append(node.name)
            node = self.tree.nodes.get(node.parent)
        return path or [name]

    # ------------------------------------------------------------------ keys

    def key_if_waiting(self, t: Tenant) -> float | None:
        return self.key(t.name) if t.queue else None

    def rekey_if_lower(self, t: Tenant, before: float | None) -> None:
        """The waiting set re-keys growing keys lazily; a key that went down must be pushed. Every event
        that may lower a tenant's key under some policy (a refund, a finished or lost request, a request
        put back at the head of the queue, a weight change) ends here."""
        if before is not None and t.queue:
            key = self.key(t.name)
            if key < before:
                self.tree.parent_of(t).waiting.push(t.name, key)
        if t.ancestors:
            self.tree.rekey_ancestors(t)

    # ------------------------------------------------------------------ the fleet's figures (shards)

    def member_figures(self) -> dict[str, tuple[float, float, float]]:
        """(service, counter, lifted) of every tenant ("t/name") and tree node ("n/name")."""
        out = {f"t/{t.name}": (t.service, t.counter, t.lifted) for t in self.tenants.values()}
        out.update({f"n/{n.name}": (n.service, n.counter, n.lifted) for n in self.tree.nodes.values()})
        return out

    def set_member_figures(self, figures: Mapping[str, tuple[float, float, float]]) -> None:
        """Set the figures of the members named (others unknown here are left out), re-keyed where
        they wait: a shard adopting the fleet's figures of a round."""
        tenants, nodes = self.tenants, self.tree.nodes
        for key, (service, counter, lifted) in figures.items():
            kind, _, name = key.partition("/")
            member: Tenant | TreeNode | None = tenants.get(name) if kind == "t" else nodes.get(name)
            if member is None or (member.service, member.counter, member.lifted) == (service, counter, lifted):
                continue
            before = self.key_if_waiting(member) if isinstance(member, Tenant) else None
            member.service, member.counter, member.lifted = service, counter, lifted
            if isinstance(member, Tenant):
                self.rekey_if_lower(member, before)
        if nodes:
            for t in tenants.values():
                if t.queue and t.ancestors:
                    self.tree.rekey_ancestors(t)

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, Any]:
        return {"tenants": [t.state() for t in self.tenants.values()], "tree": self.tree.snapshot()}

    def restore(self, data: Mapping[str, Any]) -> None:
        """On a fresh book: the nodes (parents first), the tenants with their queues, then who waits."""
        self.tree.restore_nodes(data["tree"]["nodes"])
        for row in data["tenants"]:
            t = Tenant.from_state(row)
            self.tree.attach(t, t.parent)
            self.tenants[t.name] = t
        self.tree.restore_waiting(data["tree"])
