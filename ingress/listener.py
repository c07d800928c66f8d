"""The direct front door: an ingress replica's own HTTP server on the gateway's port.

Every ingress replica on a machine binds the same address with ``SO_REUSEPORT``, and the kernel
spreads connections among them: no proxy process between clients and the ingress. Serve's front doors
(its Python proxy, or its HAProxy ingress forwarding to Serve's HTTP server in the replica) cost a
proxy hop and Serve's per-request wrapper on every request and every streamed chunk
(``fairgate bench openai`` compares the front doors; docs/speed.md). Serve still runs the replicas: it starts,
health-checks, restarts and scales them; a replica that goes away stops accepting at once and finishes
the requests it holds.

A client that disconnects is noticed here (``cancel_on_disconnect``): the request is cancelled, which
withdraws it from the dispatcher's queue or aborts it at its worker, as Serve's front doors do.

A replica replaced (a redeploy starts its successor first: ``max_surge_percent``) drains without
losing a request: it stops accepting, answers what arrives on its open connections with
``Connection: close`` (so clients reconnect to the successor), closes the connections left idle, and
finishes what runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

import uvicorn

from fairgate.ingress.http_app import GENERATION_ROUTES, ASGIApp

log = logging.getLogger(__name__)


def cancel_on_disconnect(app: ASGIApp) -> ASGIApp:
    """The generation routes run as a task that is cancelled when their client disconnects (once the
    request body has arrived, uvicorn reports a disconnect only to a ``receive`` call, which nothing
    else makes while the request waits or streams). The other routes are short and run as they are."""

    async def watched(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in GENERATION_ROUTES:
            await app(scope, receive, send)
            return
        body_read = asyncio.Event()
        complete = False

        async def receive_body() -> dict[str, Any]:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read.set()
            return message

        async def send_tracked(message: dict[str, Any]) -> None:
            nonlocal complete
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True
            await send(message)

        async def disconnected() -> None:
            await body_read.wait()
            while (await receive())["type"] != "http.disconnect":
                pass

        handler = asyncio.ensure_future(app(scope, receive_body, send_tracked))
        watcher = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait((handler, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not handler.done() and not complete:  # the client left (or the server is stopping)
                handler.cancel()
            watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await handler

    return watched


DRAIN_IDLE_S = 2.0  # a draining replica closes connections idle this long (their clients reconnect elsewhere)
# An idle keep-alive connection stays open this long. Longer than client pools keep theirs (httpx, under
# the openai client: 5 s): a server that closes first races the client's next request on that
# connection, which then fails with no response (uvicorn's default is those same 5 s).
KEEP_ALIVE_S = 75
CLOSE = (b"connection", b"close")


class DirectListener:
    """An HTTP server for ``app`` on ``host:port``, shared with the other replicas there."""

    def __init__(self, app: ASGIApp, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.draining = False
        config = uvicorn.Config(
            self._closing_when_draining(cancel_on_disconnect(app)),
            host=self.host,
            port=self.port,
            loop="none",
            lifespan="off",  # Serve ran the application's startup already
            access_log=False,
            log_level="warning",
            log_config=None,
            timeout_graceful_shutdown=None,
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # Ray's, not ours
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((self.host, self.port))
        sock.set_inheritable(True)
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError(f"the ingress's HTTP server on {self.host}:{self.port} stopped at its start")
            await asyncio.sleep(0.01)

    def _closing_when_draining(self, app: ASGIApp) -> ASGIApp:
        """Once draining, every response asks its client to close the connection after it."""

        async def served(scope: dict[str, Any], receive: Any, send: Any) -> None:
            async def send_closing(message: dict[str, Any]) -> None:
                if self.draining and message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", []), CLOSE]}
                await send(message)

            await app(scope, receive, send_closing)

        return served

    def healthy(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self, timeout_s: float) -> None:
        """Drain, then stop: no new connections (the other replicas on this port take them); requests
        on open connections still served, each answer closing its connection; after ``DRAIN_IDLE_S``
        the connections left idle are closed, and the requests in progress get until ``timeout_s``."""
        if self._task is None:
            return
        self.draining = True
        for server in getattr(self._server, "servers", []):
            server.close()
        loop = asyncio.get_running_loop()
        state = self._server.server_state
        idle_until = loop.time() + DRAIN_IDLE_S
        while state.connections and loop.time() < idle_until:
            await asyncio.sleep(0.05)
        for connection in list(state.connections):
            connection.shutdown()  # uvicorn's: an idle one closes now, a busy one after its response
        deadline = loop.time() + timeout_s
        while state.tasks and loop.time() < deadline:
            await asyncio.sleep(0.1)
        self._server.should_exit = True
        self._server.force_exit = True
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(self._task, 5.0)
