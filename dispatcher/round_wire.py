"""The shards' rounds on the wire: the runner's calls to each dispatcher shard on frames
(``common/frames.py``), as admission's, not as Ray actor calls. A Ray call costs its callee about 1 ms
of CPU here, and a round is two calls to every shard every tau: at tau 50 ms that was half a
millisecond of each shard's CPU per request at 100 requests/s. A frame costs a small fraction of it.

A ``RoundCall`` names a method and carries a JSON body; the shard answers with a ``RoundAnswer`` of the
same number. The connection opens with the handshake of ``common/frame_guard.py`` under a key for
this hop. ``RoundServer`` is the shard's end, ``RoundClient`` the runner's (one connection, asked for
the shard's address again after it breaks: a restarted shard listens elsewhere).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fairgate.common.frame_guard import ROUNDS_HOP, Guard, hop_key
from fairgate.common.frames import ConnectionLost, MessageConnection, MessageServer, connect
from fairgate.common.rpc import fairgate_pb2 as pb
from fairgate.core.shards import LastRound, ShardReport

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[Any]]


def report_json(report: ShardReport) -> dict[str, Any]:
    return {
        "batches": [[n, {k: list(f) for k, f in batch.items()}] for n, batch in report.batches],
        "waiting": report.waiting,
        "capacity": report.capacity,
        "life": report.life,
        "durable": report.durable,
    }


def report_from(data: Mapping[str, Any]) -> ShardReport:
    return ShardReport(
        [(int(n), {k: (f[0], f[1], f[2]) for k, f in batch.items()}) for n, batch in data["batches"]],
        {t: int(n) for t, n in data["waiting"].items()},
        int(data["capacity"]),
        str(data["life"]),
        int(data["durable"]),
    )


def last_json(last: LastRound) -> dict[str, Any]:
    return {"number": last.number, "figures": {k: list(f) for k, f in last.figures.items()}, "combined": last.combined}


def last_from(data: Mapping[str, Any]) -> LastRound:
    figures = {k: (f[0], f[1], f[2]) for k, f in data["figures"].items()}
    return LastRound(int(data["number"]), figures, {k: int(n) for k, n in data["combined"].items()})


class _RoundConnection(MessageConnection):
    incoming = pb.RoundCall

    def __init__(self, handlers: Mapping[str, Handler], connections: set[_RoundConnection]) -> None:
        super().__init__(connections)
        self._handlers = handlers

    def on_message(self, message: pb.RoundCall) -> None:
        self.start(str(message.call), self._answer(message))

    async def _answer(self, message: pb.RoundCall) -> None:
        answer = pb.RoundAnswer(call=message.call)
        handler = self._handlers.get(message.method)
        try:
            if handler is None:
                raise ValueError(f"no round method {message.method!r}")
            answer.body = json.dumps(await handler(json.loads(message.body))).encode()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("rounds: the shard failed on %s", message.method)
            answer.error = repr(exc)
        if not self.closed:
            self.send_message(answer)


class RoundServer(MessageServer):
    """A shard's end, on its own port (it changes when the shard restarts)."""

    def __init__(self, handlers: Mapping[str, Handler], secret: bytes, max_frame_bytes: int) -> None:
        guard = Guard(hop_key(secret, ROUNDS_HOP), max_frame_bytes)
        super().__init__(lambda connections: _RoundConnection(handlers, connections), guard)


class RoundFailed(RuntimeError):
    """The shard failed on a call (its error, as it said it)."""


class _ClientConnection(MessageConnection):
    incoming = pb.RoundAnswer

    def __init__(self) -> None:
        super().__init__()
        self.waiting: dict[int, asyncio.Future[pb.RoundAnswer]] = {}

    def on_message(self, answer: pb.RoundAnswer) -> None:
        future = self.waiting.pop(answer.call, None)
        if future is not None and not future.done():
            future.set_result(answer)

    def on_ended(self, exc: Exception | None) -> None:
        waiting, self.waiting = self.waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(ConnectionLost(str(exc) if exc else "the shard closed the connection"))


class RoundClient:
    """The runner's end: ``address`` asks where the shard listens (again after a broken connection)."""

    def __init__(self, address: Callable[[], Awaitable[str]], secret: bytes) -> None:
        self._address = address
        self._key = hop_key(secret, ROUNDS_HOP)
        self._link: _ClientConnection | None = None
        self._connecting = asyncio.Lock()
        self._numbers = itertools.count(1)

    async def call(self, method: str, body: Mapping[str, Any]) -> Any:
        async with self._connecting:  # one connection for the calls that need it at once
            link = self._link
            if link is None or link.closed:
                self._link = None
                link = self._link = await connect(await self._address(), _ClientConnection, self._key)
        number = next(self._numbers)
        future = asyncio.get_running_loop().create_future()
        link.waiting[number] = future
        link.send_message(pb.RoundCall(call=number, method=method, body=json.dumps(body).encode()))
        try:
            answer = await future
        except asyncio.CancelledError:
            link.waiting.pop(number, None)
            raise
        except ConnectionLost:
            if self._link is link:
                self._link = None
            raise
        if answer.error:
            raise RoundFailed(answer.error)
        return json.loads(answer.body)

    def close(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None
