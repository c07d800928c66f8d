"""The scheduler's tenants: registering and weighting them, the tree nodes above them, and the leaves
their request classes queue in (docs/architecture.md). A part of ``FairScheduler``, kept apart because it
changes who is compared with whom, never what is charged."""

from __future__ import annotations

from fairgate.core.classes import leaf_name
from fairgate.core.model import Tenant
from fairgate.core.tree import CLASS_SEP, ROOT, SPARE, STRICT, TreeError, TreeNode
from fairgate.core.weights import weight_problem


class TenantBook:
    """Tenants, tree nodes and class leaves of a ``FairScheduler`` (whose state it reads and writes)."""

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
            own = self.tree.nodes.get(name)
            if own is not None:
                raise TreeError(f"{name!r} is a tree node; a tenant needs a name of its own")
            tenant = Tenant(name, float(weight))
            self.tree.attach(tenant, parent or ROOT)  # refuses an unknown parent before anything changes
            self.tenants[name] = tenant
            return tenant
        own = self._class_node(tenant)
        if own is not None:
            self.tree.set_node(name, parent, float(weight))
            return tenant
        if parent is not None and parent != tenant.parent:
            self.tree.move(tenant, parent)
        before = self._key_if_waiting(tenant)
        tenant.weight = float(weight)
        self._rekey_if_lower(tenant, before)
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

    def _own_node(self, t: Tenant) -> TreeNode:
        """The tenant's own node (its request classes), made on first use: it takes the tenant's place,
        weight and counter; the tenant, now its default class, is weighted as that class."""
        own = self._class_node(t)
        if own is not None:
            return own
        spec = self.classes.get(self.default_class)
        own = self.tree.split(t, spec.weight if spec is not None else 1.0)
        for req in self.state.in_flight.values():  # the node took over their charges: their refunds go there too
            if req.tenant == t.name:
                req.path = ((own.name, req.weight), *req.path)
        return own

    def _leaf_named(self, name: str) -> Tenant:
        """The leaf of that name, made as a tenant's class leaf when it names one (``tenant~class``)."""
        tenant, sep, klass = name.partition(CLASS_SEP)
        if sep and klass in self.classes:
            return self.class_leaf(tenant, klass)
        return self.add_tenant(name)

    def _queued_of(self, t: Tenant) -> int:
        """Requests waiting for ``t``'s key: all its fair classes together (a second class is no second cap)."""
        node = self.tree.nodes.get(t.parent)
        if node is None or not node.implicit:
            return len(t.queue)
        return sum(len(leaf.queue) for leaf in node.kids.values())  # type: ignore[union-attr]

    def _class_node(self, t: Tenant) -> TreeNode | None:
        node = self.tree.nodes.get(t.parent) if t.parent == t.name else None
        return node if node is not None and node.implicit else None
