"""RPM: a per-tenant requests-per-minute limit in front of FCFS (what rate-limiting gateways do)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from fairgate.core.model import Tenant
from fairgate.core.policies.base import register
from fairgate.core.policies.fcfs import FirstComeFirstServed
from fairgate.core.registry import Param

WINDOW_S = 60.0


@register
class RequestsPerMinute(FirstComeFirstServed):
    """Admit at most LIMIT requests per tenant in any trailing 60 s (``rpm:LIMIT``); refuse the others
    (429, rate_limited); serve the admitted ones FCFS.

    Guarantee: no tenant is admitted more than N requests a minute. It is not work conserving: it
    refuses requests while capacity sits idle, and it bounds request counts, not service, so a tenant
    with long requests still gets more.
    Trade-off: predictable per-tenant load, at the price of idle GPUs under light load and of
    unfairness in cost under heavy load.
    """

    name = "rpm"
    params = (Param("limit", int, doc="requests a tenant may have admitted in any trailing minute, at least 1"),)
    examples = ("rpm:3", "rpm:20")  # refusing most requests, and letting queues fill up
    work_conserving = False

    def __init__(self, seed: int = 0, limit: int = 1) -> None:
        super().__init__(seed)
        if limit < 1:
            raise ValueError(f"policy 'rpm:{limit}': rpm needs a whole limit of at least 1, e.g. rpm:5")
        self.limit = limit
        self._admitted: dict[str, deque[float]] = {}  # tenant -> admission times within the window

    def admit(self, tenant: Tenant, now: float) -> bool:
        window = self._admitted.setdefault(tenant.name, deque())
        horizon = now - WINDOW_S
        while window and window[0] <= horizon:
            window.popleft()
        if len(window) >= self.limit:
            return False
        window.append(now)
        return True

    def snapshot(self) -> dict[str, Any]:
        return {"admitted": {name: list(times) for name, times in self._admitted.items()}}

    def restore(self, data: Mapping[str, Any]) -> None:
        self._admitted = {name: deque(float(t) for t in times) for name, times in data.get("admitted", {}).items()}
