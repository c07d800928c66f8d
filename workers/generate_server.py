"""The worker's data-plane endpoint: ingress replicas connect, send a ``GenerateRequest`` frame, and
read ``GenerateChunk`` frames until the last one (``common/frames.py``). A connection opens with the
handshake of ``common/frame_guard.py`` under the data plane's key (derived from the cluster secret):
nothing a stranger sends is parsed, and each request still needs its signed ticket.

One request at a time per connection, so TCP's own flow control is each stream's (a slow client slows
only its own request) and a connection that closes mid-request means its client left: the request is
aborted in the engine at once. A finished connection waits for the ingress's next request.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from fairgate.common.frame_guard import Guard
from fairgate.common.frames import ConnectionLost, MessageConnection, MessageServer
from fairgate.common.rpc import fairgate_pb2 as pb

log = logging.getLogger(__name__)

Serve = Callable[[pb.GenerateRequest], AsyncIterator[pb.GenerateChunk]]


class _GenerateConnection(MessageConnection):
    incoming = pb.GenerateRequest

    def __init__(self, serve: Serve, open_connections: set[_GenerateConnection]) -> None:
        super().__init__(open_connections)
        self._serve = serve

    def on_message(self, request: pb.GenerateRequest) -> None:
        if self.busy():
            self.abort()  # a second request while one runs: not an ingress of ours
            return
        self.start("", self._run(request))

    async def _run(self, request: pb.GenerateRequest) -> None:
        chunks = self._serve(request)
        try:
            async for chunk in chunks:
                self.send_message(chunk)
                await self.drain()
        except ConnectionLost:
            pass  # the ingress left: closing the chunks below aborts the request
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]


class GenerateServer(MessageServer):
    """Listens on ``host`` (``port`` 0: any free port); ``serve`` answers each request; ``guard``: who
    may connect and how much they may send. ``stop(grace_s)`` gives running requests that long."""

    def __init__(self, serve: Serve, guard: Guard) -> None:
        super().__init__(lambda connections: _GenerateConnection(serve, connections), guard)
