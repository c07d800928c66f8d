"""One HTTP request served by an in-process ASGI app (an engine's own OpenAI layer), its response read
as a stream of byte chunks: no socket, no second HTTP server, and the bytes are the app's own.

Closing the stream before the app finished tells the app the client disconnected (``http.disconnect``,
as a server would), which is how the engine's layer aborts the generation, then cancels what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextvars import Context
from dataclasses import dataclass
from typing import Any

from fairgate.workers.engines.interface import ASGIApp

_END = object()


class Linger:
    """How long a stream's bytes may wait to be joined with the next ones: at most ``seconds`` after
    the last piece went. Nothing waits until a piece that ``opens`` it has gone: what its client waits
    for first (a stream's first generated text, which may come steps after its first event: a role's
    event, tokens that decode to no text yet). ``end()`` cuts every wait short for good: the engine has
    finished the request, so its last bytes go at once (a closed-loop client's next request waits on
    them)."""

    def __init__(self, seconds: float, opens: Callable[[bytes], bool] = bool) -> None:
        self.seconds = seconds
        self.ended = False
        self.open = False
        self._opens = opens
        self._waiter: asyncio.Future[None] | None = None

    def handed(self, piece: bytes) -> None:
        """``piece`` went on: if it is the one the client waited for, later pieces may wait."""
        if not self.open:
            self.open = self._opens(piece)

    def end(self) -> None:
        self.ended = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def until(self, when: float) -> None:
        """Wait until the loop's clock reaches ``when``, or ``end()``; not at all before it opens."""
        loop = asyncio.get_running_loop()
        delay = when - loop.time()
        if self.ended or not self.open or delay <= 0:
            return
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(delay, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclass
class AsgiResponse:
    status: int
    headers: dict[str, str]
    body: AsyncIterator[bytes]  # the first piece of the body is already in it
    complete: bool = False  # that first piece is the whole body (an answer, not a stream)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/json")


async def call_asgi(
    app: ASGIApp,
    path: str,
    body: bytes,
    headers: dict[str, str],
    context: Context | None = None,
    linger: Linger | None = None,
) -> AsgiResponse:
    """POST ``body`` to ``path``; returns once the app has sent its status and first body bytes (a
    stream's first event). ``context``: the context variables the app runs with. ``linger``: hand
    bytes on at most once per its interval, joining what came meanwhile (fewer, larger pieces to relay
    when an engine steps fast); bytes before the linger opens, bytes after a quiet interval and bytes
    after the linger's end never wait."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    disconnected = asyncio.Event()
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        queue.put_nowait(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
        "state": {},
    }

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            queue.put_nowait(_END)

    loop = asyncio.get_running_loop()
    task = loop.create_task(run(), context=context) if context is not None else loop.create_task(run())
    try:
        start = await _next(queue, task)
        if start is _END or start.get("type") != "http.response.start":
            raise RuntimeError("the engine's OpenAI layer sent no response")
        response_headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
        first, more = await _body_piece(queue, task)
    except BaseException:  # the caller left (or the app failed) before its first bytes: a prefill under
        disconnected.set()  # way is aborted as for a client gone later, not left to run to its end
        await asyncio.shield(_settle(task))
        raise

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal more
        handed = loop.time()  # when the last piece was handed on
        try:
            if first:
                yield first
                handed = _handed(linger, first, loop)
            while more:
                piece, more = await _body_piece(queue, task, linger, handed)
                if piece:
                    yield piece
                    handed = _handed(linger, piece, loop)
        finally:
            disconnected.set()
            await _settle(task)

    return AsgiResponse(int(start["status"]), response_headers, chunks(), complete=not more)


def _handed(linger: Linger | None, piece: bytes, loop: asyncio.AbstractEventLoop) -> float:
    """When ``piece`` went on (now), told to its linger."""
    if linger is not None:
        linger.handed(piece)
    return loop.time()


async def _next(queue: asyncio.Queue[Any], task: asyncio.Task[None]) -> Any:
    message = await queue.get()
    if message is _END and task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]
    return message


async def _body_piece(
    queue: asyncio.Queue[Any], task: asyncio.Task[None], linger: Linger | None = None, handed: float = 0.0
) -> tuple[bytes, bool]:
    """The body bytes that are ready (after ``linger`` since ``handed``, the last piece's going),
    joined, and whether more follow."""
    pieces: list[bytes] = []
    more = True
    message = await _next(queue, task)
    if linger is not None and message is not _END and message.get("more_body", False):
        await linger.until(handed + linger.seconds)
    while True:
        if message is _END:
            more = False
            break
        if message.get("type") == "http.response.body":
            pieces.append(message.get("body", b""))
            if not message.get("more_body", False):
                more = False
                break
        if queue.empty():
            break
        message = queue.get_nowait()
    return b"".join(pieces), more


async def _settle(task: asyncio.Task[None]) -> None:
    """Give the app a moment to finish after the disconnect (it aborts its generation), then cancel."""
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.wait_for(asyncio.shield(task), 2.0)
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
