"""The ingress's observability routes: Prometheus's ``/metrics``, the live page and its data, and the
spans a replica finished. A part of ``Ingress`` (``ingress/deployment.py``)."""

from __future__ import annotations

import time
from importlib import resources
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, Response

from fairgate.common.tracing import finished_spans
from fairgate.ingress.auth import is_admin_key
from fairgate.ingress.prometheus import CONTENT_TYPE, render_prometheus

DASHBOARD_HTML = resources.files("fairgate.ingress").joinpath("dashboard.html").read_text()
DASHBOARD_HISTORY_S = 300.0  # the live page's chart: the last five minutes


class ObservabilityRoutes:
    """What the gateway shows of itself; figures come from the dispatcher, cached for a second."""

    async def metrics(self, request: Request) -> Response:
        """Prometheus exposition of the dispatcher's figures. Per-tenant series (capped at top_tenants)
        and the pool's inside (workers, their KV, queue depths) only for a scrape with the admin key:
        tenants' names and usage, and the deployment's shape and load, are nobody else's business; an
        anonymous scrape gets the tenants' figures summed (``tenant="other"``) and the fairness gauges."""
        key = request.headers.get("authorization", "").partition(" ")[2].strip()
        admin = bool(key) and is_admin_key(self._hasher.of_key(key), self._admin_key_hash)
        snapshot = await self._telemetry()
        return Response(
            render_prometheus(snapshot, self._top_tenants if admin else 0, inside=admin), media_type=CONTENT_TYPE
        )

    async def dashboard(self) -> HTMLResponse:
        """The live page; it asks for the admin key and reads /admin/dashboard.json with it."""
        return HTMLResponse(DASHBOARD_HTML)

    async def dashboard_data(self, request: Request) -> dict[str, Any]:
        await self._admin(request)
        return await self._dispatcher.telemetry(DASHBOARD_HISTORY_S)

    async def finished_spans(self) -> list[dict[str, Any]]:
        """Spans finished in this replica (telemetry traces: memory; called through a Serve handle)."""
        return finished_spans()

    async def _telemetry(self) -> dict[str, Any]:
        """The dispatcher's telemetry snapshot, shared by scrapes within a second."""
        now = time.monotonic()
        if self._snapshot is None or now - self._snapshot[0] > 1.0:
            self._snapshot = (now, await self._dispatcher.telemetry())
        return self._snapshot[1]
