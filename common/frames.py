"""Length-prefixed frames on a plain TCP connection: the wire of fairgate's two per-request hops, the
data plane (ingress <-> worker) and admission (ingress <-> dispatcher).

Why not gRPC for these two: every request crosses both, and in Python a gRPC call is the gateway's
largest fixed cost, a frame on an asyncio connection a small fraction of it (the figures:
docs/speed.md, "why the code is as it is"). The frames carry the same protobuf messages
(``proto/``), so the contracts stay in one place. The control plane (each worker's stream of step
reports to the dispatcher, a few hundred messages a second) stays on gRPC.

A frame is a 4-byte big-endian length and that many bytes. ``FrameConnection`` is the event loop's own
protocol layer (no stream objects in between): frames in, frames out, the transport's backpressure
(``drain``), and the connection's loss; ``send_message`` / ``next_message`` carry one protobuf message
per frame. ``MessageConnection`` is what both hops' ends that take messages as they come are built on
(the dispatcher's admission endpoint and its ingress client, the worker's data-plane endpoint): each
message parsed (a frame that does not parse ends the connection), the calls it started tracked by key
and cancelled when the connection ends, and the open connections kept for a server's stop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, TypeVar

from google.protobuf.message import DecodeError, Message

from fairgate.common.frame_guard import ClientHandshake, Guard, ListenerGate
from fairgate.common.waits import within

M = TypeVar("M", bound=Message)
F = TypeVar("F", bound="FrameConnection")

MAX_FRAME_BYTES = 256 << 20  # a frame longer than this is a broken or hostile peer: the connection closes
_HEADER = 4
HANDSHAKE_S = 10.0  # how long a connecting side waits for the listener's nonce


class ConnectionLost(ConnectionError):
    """The peer closed the connection, or it broke."""


class FrameConnection(asyncio.Protocol):
    """One TCP connection carrying frames. Received frames go to ``on_frame`` when one is set, else
    to a queue read with ``next_frame``. ``on_lost`` runs once when the connection ends."""

    def __init__(
        self,
        on_frame: Callable[[bytes], None] | None = None,
        on_lost: Callable[[Exception | None], None] | None = None,
    ) -> None:
        self.on_frame = on_frame
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buffer = bytearray()
        self._frames: collections.deque[bytes] = collections.deque()
        self._reader: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._lost: Exception | None = None
        self._unsent: list[bytes] = []  # frames sent during this turn of the event loop, written at its end
        self._closing = False  # closed by this side: nothing more is read or delivered
        self.limit = MAX_FRAME_BYTES  # the longest frame taken (a listener's gate lowers it)
        self.gate: Callable[[bytes], None] | None = None  # the handshake, while it takes the frames
        self.last_frame_at = time.monotonic()
        self.listener: ListenerGate | None = None  # set on a listener's connections
        self.hello_key: bytes | None = None  # set on a connecting side: it answers the listener's nonce
        self.handshake: ClientHandshake | None = None
        self._refusal: Exception | None = None

    # ------------------------------------------------------------------ protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.listener is not None:
            self.listener.admit(self)
        elif self.hello_key is not None:
            self.handshake = ClientHandshake(self, self.hello_key)

    def data_received(self, data: bytes) -> None:
        if self._closing or self.closed:
            return
        buffer = self._buffer
        buffer += data
        start, end = 0, len(buffer)
        while end - start >= _HEADER:
            size = int.from_bytes(buffer[start : start + _HEADER], "big")
            if size > self.limit:
                self.abort()
                return
            if end - start - _HEADER < size:
                break
            frame = bytes(buffer[start + _HEADER : start + _HEADER + size])
            start += _HEADER + size
            self.last_frame_at = time.monotonic()
            if self.gate is not None:
                self.gate(frame)
            else:
                self._deliver(frame)
            if self.closed or self._closing:
                return
        if start:
            del buffer[:start]

    def eof_received(self) -> bool:
        return False  # the peer is done: close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed and self._lost is not None:
            return
        self.closed = True
        self._lost = self._refusal or ConnectionLost(str(exc) if exc else "the connection was closed")
        self._buffer = bytearray()
        if self.listener is not None:
            self.listener.forget(self)
        if self.handshake is not None:
            self.handshake.lost(self._lost)
        for waiter in (self._reader, self._writable):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        if self.on_lost is not None:
            self.on_lost(self._refusal or exc)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # ------------------------------------------------------------------ use

    def _deliver(self, frame: bytes) -> None:
        if self.on_frame is not None:
            self.on_frame(frame)
            return
        self._frames.append(frame)
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)

    async def next_frame(self) -> bytes:
        """The next frame received (in order); ``ConnectionLost`` once none is left and the connection
        has ended."""
        while not self._frames:
            if self.closed:
                raise self._lost or ConnectionLost("the connection was closed")
            self._reader = asyncio.get_running_loop().create_future()
            await self._reader
        return self._frames.popleft()

    async def next_message(self, message_type: type[M]) -> M:
        """The next frame, parsed as ``message_type``."""
        return message_type.FromString(await self.next_frame())

    def send_message(self, message: Message) -> None:
        self.send(message.SerializeToString())

    def send(self, payload: bytes) -> None:
        """Queue one frame for sending (never blocks; ``drain`` waits while the peer is slow). Frames
        sent during one turn of the event loop go out in one write: a dispatcher assigning many
        requests at once answers them with one system call."""
        if self.closed or self.transport is None:
            raise self._lost or ConnectionLost("the connection was closed")
        if not self._unsent:
            asyncio.get_running_loop().call_soon(self._write)
        self._unsent += (len(payload).to_bytes(_HEADER, "big"), payload)

    def _write(self) -> None:
        unsent, self._unsent = self._unsent, []
        if unsent and not self.closed and self.transport is not None:
            self.transport.write(b"".join(unsent))

    async def drain(self) -> None:
        """Write what was sent, then wait while the transport's send buffer is over its high-water mark
        (a slow reader)."""
        self._write()
        while self._writable is not None and not self._writable.done():
            await self._writable
        if self.closed:
            raise self._lost or ConnectionLost("the connection was closed")

    def close(self) -> None:
        """Close after what was sent (the frames of this turn included); nothing received after this
        is read or delivered."""
        self._closing = True
        if self.transport is not None and not self.closed:
            self._write()
            self.transport.close()

    def refuse(self, reason: Exception) -> None:
        """End the connection with ``reason`` as what its users see (the handshake was refused)."""
        self._refusal = reason
        self.abort()

    def holds_work(self) -> bool:
        """Whether something runs for this connection (a listener never closes it as idle then)."""
        return False

    def abort(self) -> None:
        """Close at once, dropping what is not sent (a peer that must learn the request is gone)."""
        if self.transport is not None:
            self.transport.abort()
        self.closed = True


class MessageConnection(FrameConnection):
    """A connection whose frames are ``incoming`` messages, each handed to ``on_message`` as it comes.
    ``start`` runs a call for a message (one per key: a second one under the same key cancels the
    first); ``withdraw`` cancels one. When the connection ends, its calls are cancelled (nobody waits
    for their answers any more) and ``on_ended`` runs. ``registry``: the set a server keeps its open
    connections in."""

    incoming: ClassVar[type[Message]]

    def __init__(self, registry: set[Any] | None = None) -> None:
        super().__init__(on_frame=self._on_frame_bytes, on_lost=self._on_connection_lost)
        self._registry = registry
        self.calls: dict[str, asyncio.Task[None]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._registry is not None:
            self._registry.add(self)

    def on_message(self, message: Any) -> None:
        raise NotImplementedError

    def on_ended(self, exc: Exception | None) -> None:
        """The connection ended (its calls are already cancelled)."""

    def start(self, key: str, call: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        self.withdraw(key)
        task = asyncio.get_running_loop().create_task(self._tracked(key, call))
        self.calls[key] = task
        return task

    def withdraw(self, key: str) -> None:
        call = self.calls.pop(key, None)
        if call is not None:
            call.cancel()

    def busy(self) -> bool:
        return any(not call.done() for call in self.calls.values())

    def holds_work(self) -> bool:
        return self.busy()

    async def _tracked(self, key: str, call: Coroutine[Any, Any, None]) -> None:
        try:
            await call
        finally:
            if self.calls.get(key) is asyncio.current_task():
                del self.calls[key]

    def _on_frame_bytes(self, frame: bytes) -> None:
        try:
            message = self.incoming.FromString(frame)
        except DecodeError:
            self.abort()  # not a peer of ours
            return
        self.on_message(message)

    def _on_connection_lost(self, exc: Exception | None) -> None:
        if self._registry is not None:
            self._registry.discard(self)
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.cancel()
        self.on_ended(exc)


async def connect(address: str, protocol: Callable[[], F], key: bytes, timeout_s: float = HANDSHAKE_S) -> F:
    """A connection to ``host:port`` whose hello (signed with ``key``: ``common/frame_guard.py``) is
    sent: frames may follow at once. ``OSError`` when no one listens there, ``ConnectionLost`` when the
    listener ends it first (``HandshakeRefused`` when it refused the hello)."""
    host, _, port = address.rpartition(":")

    def made() -> F:
        conn = protocol()
        conn.hello_key = key
        return conn

    _, conn = await asyncio.get_running_loop().create_connection(made, host.strip("[]"), int(port))
    assert conn.handshake is not None
    try:
        await within(asyncio.shield(conn.handshake.ready), timeout_s)
    except TimeoutError:
        conn.abort()
        raise ConnectionLost(f"{address} sent no handshake within {timeout_s:.0f} s") from None
    except BaseException:
        conn.abort()
        raise
    return conn


async def listen(
    host: str, protocol: Callable[[], FrameConnection], guard: Guard, port: int = 0
) -> tuple[asyncio.Server, str, ListenerGate]:
    """A server on ``host:port`` (0: any free port) whose connections must pass ``guard``; returns
    it, the address it listens on and its gate."""
    gate = ListenerGate(guard)

    def made() -> FrameConnection:
        conn = protocol()
        conn.listener = gate
        return conn

    server = await asyncio.get_running_loop().create_server(made, host, port)
    bound = server.sockets[0].getsockname()[1]
    return server, f"{host}:{bound}", gate


class MessageServer:
    """A listener whose connections are ``MessageConnection``s (``connection`` makes one, given the set
    the server keeps them in): the admission endpoint's, the shards' rounds', a worker's data plane.
    Its address changes when its process restarts."""

    def __init__(self, connection: Callable[[set[Any]], MessageConnection], guard: Guard) -> None:
        self._connection = connection
        self._guard = guard
        self._server: asyncio.Server | None = None
        self.connections: set[MessageConnection] = set()
        self.address = ""

    async def start(self, host: str, port: int = 0) -> str:
        self._server, self.address, _ = await listen(
            host, lambda: self._connection(self.connections), self._guard, port
        )
        return self.address

    async def stop(self, grace_s: float = 0.0) -> None:
        """Take no new connections; give the calls running ``grace_s`` to end, then cut every
        connection (their calls are cancelled)."""
        if self._server is None:
            return
        self._server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while any(c.busy() for c in self.connections) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            conn.abort()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)
        self._server = None
