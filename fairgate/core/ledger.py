"""The charging ledger: every charge and refund of a tenant's service and counter goes through here.

A request is accounted at a *point* (prompt tokens, output tokens) of the cost function h (docs/architecture.md).
Its service point is what the engine did for it (the prompt from dispatch on, then each output
token); its charged point is what the tenant's counter was charged for it, which runs ahead of the
service under VTC with length prediction. ``None`` is "nothing accounted" (cost 0). Every event of
the scheduler (dispatch, decode, the engine's exact prompt count, settling a prediction, refunding an
assignment that never started, adopting a request after a restart) is a move of these two points,
and ``account`` turns it into cost: h(after) - h(before) of service (``cost_between``, the formula
written once), and the charged point's move divided by the tenant's weight on its counter.
Prompt tokens found in the engine's prefix cache are a third coordinate, accounted apart
(``account_cached``): their discount is linear, so it moves service and counter alike.
Every move is charged to the tenant's tree nodes too (docs/architecture.md: tree), each counter divided
by that node's weight: a node's counter is its subtree's weighted service. A request remembers the
nodes and weights its dispatch was charged to (``Request.path``), so that its refunds and
corrections go back there at those weights, whatever moved or was reweighted in between.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fairgate.core.costs import CostFunction
from fairgate.core.model import Tenant

Point = tuple[int, int] | None  # (prompt tokens, output tokens), or None: nothing accounted
Move = tuple[Point, Point]  # (before, after)
Path = Sequence[Sequence[Any]]  # ((node name, its weight when charged), ...): where a request's charge went


class Ledger:
    __slots__ = ("_discount", "_h", "cost", "nodes", "total")

    def __init__(self, cost: CostFunction, nodes: Mapping[str, Any] | None = None) -> None:
        self.cost = cost
        self.nodes: Mapping[str, Any] = {} if nodes is None else nodes  # the tree's nodes by name
        self._h = cost.total
        self._discount = cost.cached_discount
        self.total = 0.0  # every tenant's service together (the pool's service rate is measured on it)

    def cost_between(self, before: Point, after: Point) -> float:
        """h(after) - h(before), in cost units (unweighted)."""
        h = self._h
        return (0.0 if after is None else h(*after)) - (0.0 if before is None else h(*before))

    def account(
        self,
        tenant: Tenant,
        served: Move,
        charged: Move | None = None,
        weight: float | None = None,
        path: Path | None = None,
    ) -> None:
        """Move a request's service point (the tenant's exact service) and its charged point (the
        tenant's counter, divided by its weight); ``charged`` None: the same move as ``served``, when
        nothing is charged ahead (the cost is computed once: this runs for every step of a request).
        ``weight``: the weight a correction or refund is divided by, the one of the charge it undoes
        (a live weight change in between must not turn a refund into credit); default the current one.
        ``path``: likewise the tree nodes (and their weights) its charge went to (default: the
        tenant's ancestors now, at their weights now)."""
        amount = self.cost_between(*served)
        tenant.service += amount
        self.total += amount
        charge = amount if charged is None else self.cost_between(*charged)
        tenant.counter += charge / (tenant.weight if weight is None else weight)
        if path or tenant.ancestors:
            self._nodes_above(tenant, path, amount, charge)

    def account_cached(self, tenant: Tenant, before: int, after: int, weight: float, path: Path | None = None) -> None:
        """A request's cached prompt tokens go from ``before`` to ``after`` (expected at dispatch, the
        engine's exact count at start, back to 0 on a refund): service and counter move by the
        discount, the counter at the weight the request was charged at (and its nodes at theirs)."""
        if before == after:
            return
        amount = self._discount(before) - self._discount(after)
        tenant.service += amount
        self.total += amount
        tenant.counter += amount / weight
        if path or tenant.ancestors:
            self._nodes_above(tenant, path, amount, amount)

    def _nodes_above(self, tenant: Tenant, path: Path | None, amount: float, charge: float) -> None:
        """The same move for the tree nodes: those of ``path`` at its weights (a refund or correction:
        where the charge went), else the tenant's ancestors now at their weights now."""
        steps = ((node, node.weight) for node in tenant.ancestors) if path is None else path
        nodes = self.nodes
        for step, weight in steps:
            node = step if path is None else nodes.get(step)
            if node is not None:  # a node deleted since keeps nothing
                node.service += amount
                node.counter += charge / weight
