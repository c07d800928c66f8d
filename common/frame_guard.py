"""Who may talk on the internal frame hops, and for how long (``common/frames.py`` carries the frames).

Every connection to a frame listener (the dispatcher's admission endpoint, each worker's data plane)
opens with a handshake before anything large is read: the listener sends a fresh random nonce, and
the first frame it accepts is the HMAC of that nonce under a key derived from the cluster secret for
that hop alone. Until then a frame over ``HELLO_FRAME_BYTES`` closes the connection, so a stranger
can make the listener buffer a few KiB at most, and parses nothing; a hello must come within
``hello_s``. The listener answers the hello with a verdict frame (empty: accepted; else the reason,
then it closes), after which frames are capped at ``max_frame_bytes`` (the largest request the
ingress accepts, plus slack). A verified connection with nothing in flight for ``idle_s`` is closed.
Connections are capped: at most ``max_unverified`` wait for their hello (a new one pushes out the
oldest, so a flood of strangers cannot keep an ingress out) and ``max_connections`` in all.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

HELLO_FRAME_BYTES = 4096  # the most a connection may send before its hello is checked
NONCE_BYTES = 32
FRAME_SLACK_BYTES = 64 << 10  # a request's frame: its body and what the ingress adds around it
DEFAULT_MAX_BODY_BYTES = 1 << 20  # the largest request body the ingress accepts unless configured
ACCEPTED = b""
ADMISSION_HOP = "admission"  # ingress -> dispatcher
DATA_PLANE_HOP = "data-plane"  # ingress -> worker
ROUNDS_HOP = "rounds"  # the shards' rounds' runner -> a dispatcher shard


def frame_limit(max_body_bytes: int) -> int:
    """The longest frame a listener takes once a peer is verified: the largest body the ingress
    accepts, and what it adds around it."""
    return max_body_bytes + FRAME_SLACK_BYTES


DEFAULT_FRAME_BYTES = frame_limit(DEFAULT_MAX_BODY_BYTES)


def hop_key(secret: bytes, hop: str) -> bytes:
    """The key one hop's hellos are signed with: derived from the cluster secret for that hop only."""
    return hmac.new(secret, b"fairgate-hop-v1:" + hop.encode(), hashlib.sha256).digest()


def hello_for(key: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, nonce, hashlib.sha256).digest()


class FrameConnection(Protocol):
    """What the gate needs of a connection (``fairgate.common.frames.FrameConnection`` is one)."""

    closed: bool
    limit: int
    gate: Callable[[bytes], None] | None
    last_frame_at: float

    def send(self, payload: bytes) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...

    def refuse(self, reason: Exception) -> None: ...

    def holds_work(self) -> bool: ...


class HandshakeRefused(ConnectionError):
    """The listener refused this side's hello (a cluster secret of another gateway)."""


@dataclass(frozen=True)
class Guard:
    """What a listener demands of its connections (the module's docstring says why)."""

    key: bytes
    max_frame_bytes: int
    hello_s: float = 5.0
    idle_s: float = 120.0
    max_unverified: int = 256
    max_connections: int = 4096


class ListenerGate:
    """One listener's connections: checks each hello, runs the deadlines, enforces the caps."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self._unverified: collections.OrderedDict[FrameConnection, None] = collections.OrderedDict()
        self._verified: set[FrameConnection] = set()
        self.refused = 0  # connections closed before or at their hello (for tests and logs)

    def __len__(self) -> int:
        return len(self._unverified) + len(self._verified)

    def admit(self, conn: FrameConnection) -> None:
        """A new connection: send its nonce, start its hello deadline, make room under the caps."""
        g = self.guard
        if len(self) >= g.max_connections:
            if not self._unverified:
                self.refused += 1
                conn.abort()
                return
            self._drop(next(iter(self._unverified)))
        elif len(self._unverified) >= g.max_unverified:
            self._drop(next(iter(self._unverified)))
        nonce = os.urandom(NONCE_BYTES)
        self._unverified[conn] = None
        conn.limit = HELLO_FRAME_BYTES
        conn.gate = lambda frame: self._hello(conn, nonce, frame)
        conn.send(nonce)
        loop = asyncio.get_running_loop()
        loop.call_later(g.hello_s, self._hello_due, conn)

    def forget(self, conn: FrameConnection) -> None:
        """A connection ended (one that never passed its hello counts as refused)."""
        if conn in self._unverified:
            del self._unverified[conn]
            self.refused += 1
        self._verified.discard(conn)

    def _drop(self, conn: FrameConnection) -> None:
        self.forget(conn)
        conn.abort()

    def _hello(self, conn: FrameConnection, nonce: bytes, frame: bytes) -> None:
        if not hmac.compare_digest(frame, hello_for(self.guard.key, nonce)):
            self.forget(conn)
            conn.send(b"refused: not a peer of this gateway")
            conn.close()
            return
        del self._unverified[conn]
        self._verified.add(conn)
        conn.gate = None
        conn.limit = self.guard.max_frame_bytes
        conn.send(ACCEPTED)
        asyncio.get_running_loop().call_later(self.guard.idle_s, self._idle_due, conn)

    def _hello_due(self, conn: FrameConnection) -> None:
        if conn in self._unverified:
            self._drop(conn)

    def _idle_due(self, conn: FrameConnection) -> None:
        if conn not in self._verified or conn.closed:
            return
        now = time.monotonic()
        if conn.holds_work():  # busy counts as activity: idle time starts when its work ends
            conn.last_frame_at = now
            asyncio.get_running_loop().call_later(self.guard.idle_s / 4, self._idle_due, conn)
            return
        idle_for = now - conn.last_frame_at
        if idle_for < self.guard.idle_s:
            asyncio.get_running_loop().call_later(max(0.1, self.guard.idle_s - idle_for), self._idle_due, conn)
            return
        self.forget(conn)
        conn.close()


class ClientHandshake:
    """The connecting side: answers the listener's nonce, then reads its verdict. ``ready`` resolves
    once the hello is sent (frames may follow it at once); a refusal ends the connection with
    ``HandshakeRefused``."""

    def __init__(self, conn: FrameConnection, key: bytes) -> None:
        self._conn = conn
        self._key = key
        self._answered = False
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn.gate = self._frame

    def _frame(self, frame: bytes) -> None:
        conn = self._conn
        if not self._answered:
            self._answered = True
            conn.send(hello_for(self._key, frame))
            if not self.ready.done():
                self.ready.set_result(None)
            return
        conn.gate = None
        if frame != ACCEPTED:
            conn.refuse(HandshakeRefused(frame.decode(errors="replace")))

    def lost(self, exc: Exception) -> None:
        if not self.ready.done():
            self.ready.set_exception(exc)
