"""A cap on one tenant's open HTTP requests at an ingress replica.

The dispatcher caps what a tenant keeps queued, but a request is open at the replica before it is
queued (its body arriving, its prompt being counted) and while it streams; each holds a connection,
a task and its body. Past ``limit`` open requests, a tenant's next one is refused at once (429 with
``Retry-After``) before its body is read, so one tenant cannot fill a replica's request slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fairgate.common.openai_errors import ApiError
from fairgate.ingress.http_app import ASGIApp


class OpenRequests:
    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._open: dict[str, int] = {}

    def take(self, tenant: str) -> Callable[[], None]:
        """Count one more open request of ``tenant``; returns what ends it (idempotent)."""
        n = self._open.get(tenant, 0)
        if n >= self._limit:
            raise ApiError(
                429,
                f"this key has {n} requests open at this replica, the most it may; retry when some end",
                type_="rate_limit_error",
                code="too_many_open_requests",
                headers={"Retry-After": "1"},
            )
        self._open[tenant] = n + 1
        done = False

        def release() -> None:
            nonlocal done
            if done:
                return
            done = True
            left = self._open[tenant] - 1
            if left:
                self._open[tenant] = left
            else:
                del self._open[tenant]

        return release


def released_after(app: ASGIApp, release: Callable[[], None]) -> ASGIApp:
    """``app``, with ``release`` run once it has answered (or failed, or its client left)."""

    async def answered(scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await app(scope, receive, send)
        finally:
            release()

    return answered
