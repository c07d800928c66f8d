"""The charging ledger: every charge and refund of a tenant's service and counter goes through here.

A request is accounted at a *point* (prompt tokens, output tokens) of the cost function h (DESIGN §1).
Its service point is what the engine did for it (the prompt from dispatch on, then each output
token); its charged point is what the tenant's counter was charged for it, which runs ahead of the
service under VTC with length prediction. ``None`` is "nothing accounted" (cost 0). Every event of
the scheduler (dispatch, decode, the engine's exact prompt count, settling a prediction, refunding an
assignment that never started, adopting a request after a restart) is a move of these points, and
the ledger turns a move into cost: h(after) - h(before) of service, and the same divided by the
tenant's weight on its counter (``serve`` moves both points together, the common case; ``charge``
moves the charged point alone). That formula is written once, in ``cost_between``.
"""

from __future__ import annotations

from dispatcher.core.costs import CostFunction
from dispatcher.core.model import Tenant

Point = tuple[int, int] | None  # (prompt tokens, output tokens), or None: nothing accounted


class Ledger:
    __slots__ = ("_h", "cost")

    def __init__(self, cost: CostFunction) -> None:
        self.cost = cost
        self._h = cost.total

    def cost_between(self, before: Point, after: Point) -> float:
        """h(after) - h(before), in cost units (unweighted)."""
        h = self._h
        return (0.0 if after is None else h(*after)) - (0.0 if before is None else h(*before))

    def serve(self, tenant: Tenant, before: Point, after: Point, *, charge: bool = True) -> None:
        """The engine served a request's move from ``before`` to ``after``: its cost is added to the
        tenant's exact service and, unless that service was charged ahead, to its counter."""
        amount = self.cost_between(before, after)
        tenant.service += amount
        if charge:
            tenant.counter += amount / tenant.weight

    def charge(self, tenant: Tenant, before: Point, after: Point) -> None:
        """Move only a request's charged point (charging ahead of service, or settling a prediction)."""
        tenant.counter += self.cost_between(before, after) / tenant.weight
