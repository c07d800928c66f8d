"""The data plane of one request: relay the engine's response bytes from the assigned worker.

Bytes go worker -> ingress -> client unchanged (the engine's own OpenAI layer wrote them on the
worker); the dispatcher never sees them. They travel as frames on a TCP connection to the worker
(``common/frames.py``): one request at a time per connection, kept open for the next request. Closing
the iterator early (the client gone) closes its connection, and the worker aborts the request.
"""

from __future__ import annotations

import collections
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from fairgate.common.frame_guard import DATA_PLANE_HOP, hop_key
from fairgate.common.frames import ConnectionLost, FrameConnection, connect
from fairgate.common.rpc import fairgate_pb2 as pb


class WorkerLost(Exception):
    """The worker failed while the request was running. Its text is what the client may read (no
    address, no exception text); ``detail`` is for the logs. ``retryable``: the failure says nothing
    about the request itself (the worker was unreachable, refused the ticket, or ended the stream), so
    another worker may serve it; otherwise placing it again would only fail again."""

    PUBLIC = "the worker serving this request failed"

    def __init__(self, detail: str, *, retryable: bool = True, code: str = "") -> None:
        super().__init__(self.PUBLIC)
        self.detail = detail
        self.retryable = retryable
        self.code = code  # the worker's refusal code, when it refused (e.g. "revoked": taken back unstarted)


@dataclass
class Outcome:
    """Filled in as the stream goes; final once the iterator ends."""

    status: int = 0
    content_type: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    received: bool = False  # the worker sent something: the request must not run anywhere else
    released: bool = False  # given up before anything arrived: its reservation was freed
    shard: int = 0  # the dispatcher shard that placed it (where it is released or asked again)


IDLE_KEPT = 64  # idle connections kept per worker (more are closed as their requests end)
IDLE_REUSE_S = 60.0  # an idle connection is reused this long after its last frame (workers close it later)


class WorkerConnections:
    """Connections to workers, reused across requests: each carries one request at a time, then waits
    idle for the next. A connection whose request did not end cleanly is closed, never reused, so one
    request's failure cannot reach another's stream."""

    def __init__(self, secret: bytes) -> None:
        self._idle: dict[str, collections.deque[FrameConnection]] = {}
        self._key = hop_key(secret, DATA_PLANE_HOP)

    async def take(self, address: str) -> FrameConnection:
        idle = self._idle.get(address)
        fresh_since = time.monotonic() - IDLE_REUSE_S
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.last_frame_at >= fresh_since:
                return conn
            conn.close()  # the worker closes connections idle longer than this: never race it
        return await connect(address, FrameConnection, self._key)

    def give_back(self, address: str, conn: FrameConnection) -> None:
        idle = self._idle.setdefault(address, collections.deque())
        if conn.closed or len(idle) >= IDLE_KEPT:
            conn.close()
            return
        idle.append(conn)

    def forget(self, address: str) -> None:
        """The worker at ``address`` could not be reached: its idle connections are dropped."""
        for conn in self._idle.pop(address, ()):
            conn.close()

    async def close(self) -> None:
        for address in list(self._idle):
            self.forget(address)


async def stream_bytes(
    connections: WorkerConnections,
    address: str,
    request: pb.GenerateRequest,
    outcome: Outcome,
    trace_context: Mapping[str, str] | None = None,
    on_first: Callable[[], None] | None = None,
) -> AsyncIterator[bytes]:
    """Yield the engine's response bytes as the worker sends them; ``outcome`` holds the status and
    content type from the first chunk, and the counts and finish reason when it ends.
    ``trace_context`` goes with the request; ``on_first`` runs when the worker's first chunk arrives."""
    try:
        conn = await connections.take(address)
    except OSError as exc:
        connections.forget(address)
        raise WorkerLost(f"worker {address}: unreachable: {exc}") from None
    clean = False
    try:
        if trace_context:
            request.trace_context.update(trace_context)
        conn.send_message(request)
        while True:
            chunk = await conn.next_message(pb.GenerateChunk)
            if chunk.HasField("refusal"):
                r = chunk.refusal
                clean = True  # the worker answered: the connection serves the next request
                raise WorkerLost(f"worker {address}: {r.code}: {r.detail}", retryable=r.retryable, code=r.code)
            if not outcome.received:
                outcome.received = True
                outcome.status, outcome.content_type = chunk.status or 200, chunk.content_type
                if on_first is not None:
                    on_first()
            outcome.prompt_tokens = chunk.prompt_tokens
            outcome.completion_tokens = chunk.completion_tokens
            if chunk.data:
                yield chunk.data
            if chunk.finish_reason:
                outcome.finish_reason = chunk.finish_reason
                clean = True
                return
    except ConnectionLost as exc:
        raise WorkerLost(f"worker {address} ended the stream without finishing: {exc}") from None
    finally:
        if clean:
            connections.give_back(address, conn)
        else:
            conn.abort()  # the client left, or the stream broke: the worker aborts what it runs
