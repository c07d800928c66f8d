"""FCFS: one global queue in arrival order (what a plain server does)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fairgate.core.model import Tenant
from fairgate.core.policies.base import FairnessPolicy, register


@register
class FirstComeFirstServed(FairnessPolicy):
    """Serve requests in global arrival order, whoever sent them.

    Guarantee: none between tenants: a tenant that sends twice as much gets twice the service, and the
    service gap between two backlogged tenants grows linearly with time. Work conserving.
    Trade-off: simple and throughput-optimal for one tenant; a heavy tenant delays everyone else's
    first token by its whole backlog.
    """

    name = "fcfs"

    def key_function(self, tenants: Mapping[str, Tenant]) -> Callable[[str], float]:
        return lambda name: tenants[name].queue[0].seq
