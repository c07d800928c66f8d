"""LCF, least counter first: VTC without the lift (a baseline that shows why the lift is needed)."""

from __future__ import annotations

from collections.abc import Callable

from fairgate.core.model import Tenant
from fairgate.core.policies.base import register
from fairgate.core.policies.vtc import VirtualTokenCounter


@register
class LeastCounterFirst(VirtualTokenCounter):
    """Serve the waiting tenant with the smallest counter, with no lift when a tenant re-joins.

    Guarantee: none across idle periods. A tenant idle for a while keeps the low counter it had and,
    when it comes back, is served alone until it has caught up with the others: the others starve for
    a time that grows with how long it was idle, and the backlogged gap grows past 2U.
    Trade-off: it rewards idleness (banked credit); kept as the baseline the paper compares VTC with.
    """

    name = "lcf"

    def rejoin(self, tenant: Tenant, floor: Callable[[], Tenant | None]) -> None:
        return None

    def bound(self, u: float) -> float | None:
        return None
