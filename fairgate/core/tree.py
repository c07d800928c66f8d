"""The tenant tree (docs/architecture.md: tree): organisations, teams and keys, each weighted, none starving.

Tenants (the queues) are the leaves; internal nodes group them. Every node has a counter of the
weighted service of its subtree (each charge of a leaf is charged to every node above it, divided by
that node's weight) and a waiting set of its children that have waiting work, ordered by their
counters (a leaf by the policy's key). A decision descends from the root taking the smallest child
at each level: O(depth · log fan-out). A child that gets waiting work again joins its parent's
waiting set through the policy's ``rejoin`` (VTC's lift, per level), so idle time earns no credit at
any level; for any two backlogged siblings the policy's bound holds between their counters.

A flat list of tenants is a tree of depth 1 (every tenant a child of the root): the same decisions as
without a tree, at the same cost. A second root holds the strict band (operator traffic), served
before everything and charged to no node of the fair tree.

A tenant with request classes becomes a node of its own (``implicit``, named as the tenant): its
default class stays the leaf of the tenant's name, each other class a leaf ``tenant~class`` beside
it, weighted against each other the same way.

Pure: no I/O; the scheduler keeps the leaves' queues and asks this module where they sit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fairgate.core.model import Tenant
from fairgate.core.waiting import WaitingSet
from fairgate.core.weights import weight_problem

ROOT = ""  # the fair tree's root
STRICT = "~strict"  # the strict band's root (no tenant or node name can contain "~")
SPARE = "~spare"  # the spare band's root: requests over a demoting quota, served from what no one else wants
CLASS_SEP = "~"


class TreeError(ValueError):
    """A change of the tree that cannot be made (a cycle, an unknown parent, a weight <= 0, ...)."""


@dataclass(slots=True, eq=False)
class TreeNode:
    """An internal node. ``counter``: its subtree's weighted service (charges / its weight, plus
    lifts); ``service``: its subtree's exact service since it exists; ``waiting``: its children with
    waiting work; ``last_left``: the last child to leave it (the lift's floor when none waits)."""

    name: str
    weight: float = 1.0
    parent: str = ROOT
    counter: float = 0.0
    service: float = 0.0
    lifted: float = 0.0
    implicit: bool = False  # a tenant's own node, holding its request classes
    unstarted: float = 0.0  # of ``counter``, charged for requests engines hold unstarted (kept under revoke)
    kids: dict[str, Tenant | TreeNode] = field(default_factory=dict)
    waiting: WaitingSet = field(default_factory=lambda: WaitingSet(_unkeyed))  # keyed by the tree that holds it
    last_left: str | None = None

    def row(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "weight": self.weight,
            "parent": self.parent,
            "counter": self.counter,
            "service": self.service,
            "lifted": self.lifted,
            "implicit": self.implicit,
            "unstarted": self.unstarted,
        }


Member = Tenant | TreeNode
Rejoin = Callable[[Any, Callable[[], Any]], None]


def _unkeyed(name: str) -> float:
    """The key of a node's waiting set before a tree keys it (a copy's, e.g. in a durable state, never asks)."""
    raise LookupError(f"{name!r}: a tree node outside a tree has no waiting set")


class TenantTree:
    """Where each tenant sits, and the waiting sets along the way. ``leaf_key``: the policy's key of a
    waiting tenant; ``rejoin``: the policy's lift, applied to leaves and nodes alike."""

    def __init__(self, tenants: Mapping[str, Tenant], leaf_key: Callable[[str], float], rejoin: Rejoin) -> None:
        self._tenants = tenants
        self._leaf_key = leaf_key
        self._rejoin = rejoin
        self.nodes: dict[str, TreeNode] = {}
        self.root = TreeNode(ROOT)
        self.root.waiting = WaitingSet(leaf_key)
        self.strict = TreeNode(STRICT)
        self.strict.waiting = WaitingSet(leaf_key)
        self.spare = TreeNode(SPARE)
        self.spare.waiting = WaitingSet(leaf_key)
        self.bands = (self.strict, self.root, self.spare)  # served in this order
        self.resumed: set[str] = set()  # nodes that were waiting when the durable state was written

    # ------------------------------------------------------------------ structure

    def parent_of(self, member: Member) -> TreeNode:
        return self.node(member.parent)

    def node(self, name: str) -> TreeNode:
        if name == ROOT:
            return self.root
        if name == STRICT:
            return self.strict
        if name == SPARE:
            return self.spare
        node = self.nodes.get(name)
        if node is None:
            raise TreeError(f"no tree node {name!r}")
        return node

    @property
    def depth(self) -> int:
        """Levels of the fair tree (1: flat)."""
        return 1 + max((self._depth(n) for n in self.nodes.values()), default=0)

    def attach(self, t: Tenant, parent: str) -> None:
        """Place a new tenant (no queue yet) under ``parent``."""
        node = self.node(parent)
        self._check_free(node, t.name, t)
        t.parent = node.name
        node.kids[t.name] = t
        t.ancestors = self._ancestors(node)

    def set_node(self, name: str, parent: str | None, weight: float | None, implicit: bool = False) -> TreeNode:
        """Create a node, or move and reweight one (None: keep). Takes effect at the next decision."""
        if weight is not None and (problem := weight_problem(weight)):
            raise TreeError(f"node {name!r}: {problem}")
        node = self.nodes.get(name)
        if node is None:
            if not name or CLASS_SEP in name:
                raise TreeError(f"node names are non-empty and have no {CLASS_SEP!r}, got {name!r}")
            if name in self._tenants and not implicit:
                raise TreeError(f"{name!r} is a tenant; a node needs a name of its own")
            above = self.node(parent or ROOT)
            if above is self.strict or above is self.spare:
                raise TreeError("the strict and spare bands hold no tree nodes")
            self._check_free(above, name, None)
            node = self.nodes[name] = TreeNode(name, float(weight or 1.0), above.name, implicit=implicit)
            node.waiting = WaitingSet(self._member_key(node))
            above.kids[name] = node
            self._mixed(above)
            return node
        if weight is not None:
            node.weight = float(weight)
            self._rekey(node)
        if parent is not None and parent != node.parent:
            self.move(node, parent)
        return node

    def split(self, t: Tenant, weight: float) -> TreeNode:
        """Give tenant ``t`` a node of its own (for its request classes): the node takes its place,
        name, weight and counter; ``t`` becomes the node's first leaf, of ``weight``."""
        above = self.parent_of(t)
        waiting = self._is_waiting(t)
        if waiting:
            self._leave_from(t, above)
        del above.kids[t.name]
        node = TreeNode(t.name, t.weight, above.name, t.counter, t.service, t.lifted, implicit=True)
        node.waiting = WaitingSet(self._member_key(node))
        self.nodes[t.name] = node
        above.kids[t.name] = node
        self._mixed(above)
        t.parent, t.weight = node.name, float(weight)
        node.kids[t.name] = t
        t.ancestors = self._ancestors(node)
        if waiting:
            self.join(t, lift=False)
        return node

    def delete_node(self, name: str) -> None:
        node = self.node(name)
        if node in self.bands:
            raise TreeError("the roots cannot be deleted")
        if node.kids:
            raise TreeError(f"node {name!r} still has {len(node.kids)} member(s): move or delete them first")
        del self.parent_of(node).kids[name]
        del self.nodes[name]

    def move(self, member: Member, parent: str) -> None:
        """Move a tenant or a node (with its subtree) under ``parent``. Its counter rises to the new
        siblings' floor if below it (a counter from another level is no credit here); what its
        subtree was served stays counted in the nodes it leaves."""
        target = self.node(parent)
        old = self.parent_of(member)
        if target is old:
            return
        if type(member) is TreeNode and (target is member or member in self._path(target)):
            raise TreeError(f"moving {member.name!r} under {parent!r} would make a cycle")
        if target is self.strict or target is self.spare:
            raise TreeError("the strict and spare bands hold only what the gateway puts there")
        self._check_free(target, member.name, member)
        waiting = self._is_waiting(member)
        if waiting:
            self._leave_from(member, old)
        del old.kids[member.name]
        member.parent = target.name
        target.kids[member.name] = member
        self._mixed(target)
        floor = self._floor(target)
        if floor is not None and floor.counter > member.counter:
            member.lifted += floor.counter - member.counter
            member.counter = floor.counter
        for leaf in self.leaves(member):
            leaf.ancestors = self._ancestors(self.parent_of(leaf))
        if waiting:  # its new ancestors that were idle are lifted as they join: no credit from idleness
            self.join(member, lift=False, lift_above=True)

    def leaves(self, member: Member) -> Iterator[Tenant]:
        if isinstance(member, TreeNode):
            for kid in member.kids.values():
                yield from self.leaves(kid)
        else:
            yield member

    # ------------------------------------------------------------------ waiting work

    def join(self, member: Member, lift: bool = True, lift_above: bool | None = None) -> None:
        """``member`` has waiting work again: it joins its parent's waiting set, and so on up while the
        parent was not waiting itself. ``lift``: by the policy's rule, at every level (a node that was
        waiting when the durable state was written is not lifted); False for a request put back at
        the head of its queue, which waited all along. ``lift_above``: for the nodes above that join
        with it (default: as ``lift``; a moved member's new ancestors are lifted, it is not)."""
        node, lift_nodes = self.parent_of(member), lift if lift_above is None else lift_above
        while True:
            joined_before = len(node.waiting) > 0
            if lift:
                self._rejoin(member, partial(self._floor, node))
            node.waiting.push(member.name, self.key_in(member))
            if joined_before or node in self.bands:
                return
            member, node = node, self.parent_of(node)
            lift = lift_nodes and member.name not in self.resumed
            self.resumed.discard(member.name)

    def leave(self, t: Tenant, at_top: bool) -> None:
        """``t`` has no waiting request left: it leaves its parent's waiting set, and so on up while the
        parent has no other waiting child. ``at_top``: ``t`` is its parent's peek."""
        node = self.parent_of(t)
        if at_top:
            node.waiting.pop_top(t.name)
            node.last_left = t.name
            self._cascade(node)
        else:
            self._leave_from(t, node)

    def pick(self) -> tuple[float, Tenant, TreeNode] | None:
        """The leaf served next: the strict band first, then down the fair tree taking the smallest
        child at each level, then the spare band. Returns (its key, the tenant, its parent) or None when
        no one waits."""
        node = next((band for band in self.bands if len(band.waiting)), self.root)
        while True:
            top = node.waiting.peek()
            if top is None:
                return None
            member = node.kids[top[1]]
            if not isinstance(member, TreeNode):
                return top[0], member, node
            node = member

    def any_waiting(self) -> bool:
        return any(len(band.waiting) for band in self.bands)

    def rekey_ancestors(self, t: Tenant) -> None:
        """Counters above ``t`` may have gone down (a refund, a correction): re-key them where they wait
        (the waiting sets re-key only growing keys by themselves)."""
        for node in t.ancestors:
            self._rekey(node)

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, Any]:
        every = [*self.bands, *self.nodes.values()]
        return {
            "nodes": [n.row() for n in self.nodes.values()],  # in their order here (restored parents first)
            "waiting": {n.name: [[m, tie] for m, tie in n.waiting.entries()] for n in every},
            "ties": {n.name: n.waiting.next_tie for n in every},
            "last_left": {n.name: n.last_left for n in every if n.last_left is not None},
            "resumed": sorted(self.resumed),
        }

    def restore_nodes(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Re-create nodes with their counters, parents first, then in the order the rows give them;
        tenants are attached afterwards."""
        given = {str(row["name"]): row for row in rows}
        parents = {name: (str(row.get("parent", ROOT)), float(row["weight"])) for name, row in given.items()}
        for name, parent, weight in parents_first(parents):
            row = given[name]
            node = self.set_node(name, parent, weight, bool(row.get("implicit")))
            node.counter, node.service, node.lifted = float(row["counter"]), float(row["service"]), float(row["lifted"])
            node.unstarted = float(row.get("unstarted", 0.0))
        for node in [self.nodes.pop(name) for name in given]:  # in place: the ledger holds this mapping
            self.nodes[node.name] = node

    def restore_waiting(self, data: Mapping[str, Any]) -> None:
        for name, entries in data["waiting"].items():
            node = self.node(name)
            node.waiting.load([(m, int(tie)) for m, tie in entries], int(data["ties"][name]))
        for name, left in data.get("last_left", {}).items():
            self.node(name).last_left = left
        self.resumed = set(data.get("resumed", ()))

    def waiting_nodes(self) -> list[str]:
        return [n.name for n in self.nodes.values() if len(n.waiting)]

    # ------------------------------------------------------------------ internals

    def snapshot_order(self) -> list[TreeNode]:
        """Nodes, parents before children (the order they can be created again in)."""
        return sorted(self.nodes.values(), key=self._depth)

    def _depth(self, node: TreeNode) -> int:
        return len(self._path(node))

    def _path(self, node: TreeNode) -> list[TreeNode]:
        """``node`` and the nodes above it, nearest first (the roots excluded)."""
        path = []
        while node not in self.bands:
            path.append(node)
            node = self.node(node.parent)
        return path

    def _ancestors(self, node: TreeNode) -> tuple[TreeNode, ...]:
        return tuple(self._path(node))

    def _check_free(self, node: TreeNode, name: str, member: Member | None) -> None:
        there = node.kids.get(name)
        if there is not None and there is not member:
            raise TreeError(f"{node.name or 'the root'} already has a member named {name!r}")

    def _member_key(self, node: TreeNode) -> Callable[[str], float]:
        kids, leaf_key = node.kids, self._leaf_key

        def key(name: str) -> float:
            member = kids[name]
            return member.counter if type(member) is TreeNode else leaf_key(name)

        return key

    def _mixed(self, node: TreeNode) -> None:
        """A node whose children include nodes keys its waiting set by member (not by tenant name)."""
        if node.waiting is not None and node.waiting.key_of is self._leaf_key:
            node.waiting.key_of = self._member_key(node)

    def key_in(self, member: Member) -> float:
        return member.counter if type(member) is TreeNode else self._leaf_key(member.name)

    def _is_waiting(self, member: Member) -> bool:
        return member.name in self.parent_of(member).waiting

    def _leave_from(self, member: Member, node: TreeNode) -> None:
        node.waiting.remove(member.name)
        node.last_left = member.name
        self._cascade(node)

    def _cascade(self, node: TreeNode) -> None:
        while not len(node.waiting) and node not in self.bands:
            above = self.parent_of(node)
            above.waiting.remove(node.name)
            above.last_left = node.name
            node = above

    def _rekey(self, node: TreeNode) -> None:
        if len(node.waiting):
            self.parent_of(node).waiting.push(node.name, node.counter)

    def _floor(self, node: TreeNode) -> Any:
        """The lift's floor among ``node``'s children: the least-served waiting one, or the last to leave."""
        top = node.waiting.peek()
        if top is not None:
            return node.kids[top[1]]
        return None if node.last_left is None else node.kids.get(node.last_left)


def parents_first(nodes: Mapping[str, tuple[str, float]]) -> list[tuple[str, str, float]]:
    """Nodes (name -> (parent, weight)) ordered so that every parent comes before its children, as
    they can be created; raises TreeError naming an unknown parent or a cycle."""
    ordered: list[tuple[str, str, float]] = []
    placed: set[str] = {ROOT}
    for name in nodes:
        chain: list[str] = []
        at = name
        while at not in placed:
            if at in chain:
                raise TreeError(f"node {at!r} is its own ancestor (a cycle)")
            if at not in nodes:
                raise TreeError(f"node {chain[-1]!r}: no tree node {at!r} to be its parent")
            chain.append(at)
            at = nodes[at][0]
        for member in reversed(chain):
            ordered.append((member, *nodes[member]))
            placed.add(member)
    return ordered


def check_tree(nodes: Mapping[str, tuple[str, float]], tenants: Iterable[tuple[str, str, float]]) -> None:
    """Build the tree these nodes (name -> (parent, weight)) and tenants ((name, parent, weight)) make,
    once, apart: raises TreeError naming the first problem (a cycle, an unknown parent, a weight <= 0,
    a name used twice). The registry and the configuration check every change with it."""
    known: dict[str, Tenant] = {}
    scratch = TenantTree(known, lambda name: 0.0, lambda member, floor: None)
    for name, parent, weight in parents_first(nodes):
        scratch.set_node(name, parent or None, weight)
    for name, parent, weight in tenants:
        if name in scratch.nodes:
            raise TreeError(f"{name!r} is a tree node; a tenant needs a name of its own")
        if problem := weight_problem(weight):
            raise TreeError(f"tenant {name!r}: {problem}")
        if parent and parent not in scratch.nodes:
            raise TreeError(f"tenant {name!r}: no tree node {parent!r}")
        known[name] = Tenant(name, weight)
        scratch.attach(known[name], parent or ROOT)
