"""VTC with locality slack: fair like VTC, and a longer cached prefix preferred within Δ."""

from __future__ import annotations

from fairgate.core.policies.base import register
from fairgate.core.policies.vtc import VirtualTokenCounter
from fairgate.core.registry import Param

DEFAULT_SLACK = 2_000.0


@register
class LocalityVTC(VirtualTokenCounter):
    """VTC's counters, lift and charges, with the locality slack Δ of docs/architecture.md: the scheduler may
    serve, instead of the least-served waiting tenant, a waiting tenant whose counter is within Δ
    of it, when that tenant's next request finds a longer cached prefix on a worker that can start
    it now (and at most ``relaxed_scan`` tenants are looked at). Δ is in counter units (weighted
    cost); ``vtc-locality:0`` is plain VTC.

    Guarantee: two tenants backlogged over the same interval receive service within 2U + Δ of each
    other (weighted: divided by the smaller weight). A tenant is only ever served while its counter
    is at most Δ above the smallest waiting one, so no backlogged counter runs more than U + Δ ahead
    of the least-served, where VTC's runs at most U; the lift is VTC's. Work-conserving like VTC.
    Trade-off: within Δ, who goes first follows the cache, not the counter, so short-term shares
    wobble by up to Δ; and a cache hit is charged less (``w_c``), so tenants whose traffic repeats
    get more tokens for the same share.
    """

    name = "vtc-locality"
    params = (
        Param(
            "slack", float, DEFAULT_SLACK, "Δ, in counter units: how far above the least served a tenant may go first"
        ),
    )
    examples = ("vtc-locality:0", "vtc-locality:500", "vtc-locality")

    def __init__(self, seed: int = 0, slack: float = DEFAULT_SLACK) -> None:
        super().__init__(seed)
        if not slack >= 0 or slack == float("inf"):
            raise ValueError(f"vtc-locality: the slack must be a finite number >= 0, got {slack}")
        self.slack = self.locality_slack = float(slack)

    def bound(self, u: float) -> float | None:
        return 2.0 * u + self.locality_slack
