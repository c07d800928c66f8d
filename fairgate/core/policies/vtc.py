"""VTC: the Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language Models", OSDI'24)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fairgate.core.model import Tenant
from fairgate.core.policies.base import FairnessPolicy, register


@register
class VirtualTokenCounter(FairnessPolicy):
    """Serve the waiting tenant with the smallest counter of weighted service (prompt tokens charged at
    dispatch, each output token as it is generated, divided by the tenant's weight). A tenant that
    re-joins the waiting set is lifted to the smallest waiting counter (or, when no one waits, to the
    counter of the last tenant to leave), so time spent idle earns no credit; a counter is never
    lowered by the lift, so debt is kept.

    Guarantee: two tenants backlogged over the same interval receive service within 2U of each other
    (weighted: within 2U divided by the smaller weight), U = max(w_p × longest prompt, w_q × the KV pool
    in tokens); the scheduler never leaves capacity idle while anyone waits.
    Trade-off: a tenant's share does not depend on how much it sends, so a tenant asking for less than
    its share gets all it asks for while the others split the rest; output is charged only as it is
    generated, so a request's full cost is known only when it ends.
    """

    name = "vtc"
    tree = True

    def key_function(self, tenants: Mapping[str, Tenant]) -> Callable[[str], float]:
        return lambda name: tenants[name].counter

    def rejoin(self, tenant: Tenant, floor: Callable[[], Tenant | None]) -> None:
        least = floor()
        level = None if least is None else least.counter - least.unstarted  # service it has begun to get
        if level is not None and level > tenant.counter:
            tenant.lifted += level - tenant.counter
            tenant.counter = level

    def bound(self, u: float) -> float | None:
        return 2.0 * u
