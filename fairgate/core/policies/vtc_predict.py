"""VTC with output-length prediction from each tenant's recent requests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairgate.core.model import Request, Tenant
from fairgate.core.policies.base import register
from fairgate.core.policies.vtc import VirtualTokenCounter
from fairgate.core.predictors import MovingAveragePredictor, Predictor


@register
class VtcPredict(VirtualTokenCounter):
    """VTC that charges a request's predicted output at dispatch (here: the mean of the tenant's last
    20 output lengths, the global mean for a new tenant), charges only tokens beyond the prediction
    while decoding, and refunds the unused part when the request ends short.

    Guarantee: VTC's order with the charge moved earlier. A counter runs ahead of the service by at
    most the predicted output of its requests in flight, which all fit in the KV pool together, so
    two backlogged tenants' service stays within 3U (weighted: divided by the smaller weight).
    Trade-off: a tenant with long outputs pays for them before they are generated, which lets short
    requests of others through sooner; a wrong prediction only shifts when a charge is made.
    """

    name = "vtc-predict"

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.predictor: Predictor = MovingAveragePredictor()

    def predict(self, tenant: Tenant, request: Request) -> int:
        return self.predictor.predict(tenant.name, request.max_tokens, request.true_output)

    def observe(self, tenant: str, output_tokens: int) -> None:
        self.predictor.observe(tenant, output_tokens)

    def bound(self, u: float) -> float | None:
        return 3.0 * u

    def snapshot(self) -> dict[str, Any]:
        return self.predictor.snapshot()

    def restore(self, data: Mapping[str, Any]) -> None:
        self.predictor.restore(dict(data))
