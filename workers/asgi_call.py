"""One HTTP request served by an in-process ASGI app (an engine's own OpenAI layer), its response read
as a stream of byte chunks: no socket, no second HTTP server, and the bytes are the app's own.

Closing the stream before the app finished tells the app the client disconnected (``http.disconnect``,
as a server would), which is how the engine's layer aborts the generation, then cancels what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextvars import Context
from dataclasses import dataclass
from typing import Any

from workers.engines.interface import ASGIApp

_END = object()


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
    linger_s: float = 0.0,
) -> AsgiResponse:
    """POST ``body`` to ``path``; returns once the app has sent its status and first body bytes (a
    stream's first event). ``context``: the context variables the app runs with. ``linger_s``: hand
    bytes on at most once per ``linger_s``, joining what came meanwhile (fewer, larger pieces to relay
    when an engine steps fast); the first byte, and bytes after a quiet ``linger_s``, never wait."""
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
    start = await _next(queue, task)
    if start is _END or start.get("type") != "http.response.start":
        await _settle(task)
        raise RuntimeError("the engine's OpenAI layer sent no response")
    response_headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
    first, more = await _body_piece(queue, task)

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal more
        handed = loop.time()  # when the last piece was handed on
        try:
            if first:
                yield first
                handed = loop.time()
            while more:
                piece, more = await _body_piece(queue, task, handed + linger_s if linger_s else 0.0)
                if piece:
                    yield piece
                    handed = loop.time()
        finally:
            disconnected.set()
            await _settle(task)

    return AsgiResponse(int(start["status"]), response_headers, chunks(), complete=not more)


async def _next(queue: asyncio.Queue[Any], task: asyncio.Task[None]) -> Any:
    message = await queue.get()
    if message is _END and task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]
    return message


async def _body_piece(
    queue: asyncio.Queue[Any], task: asyncio.Task[None], not_before: float = 0.0
) -> tuple[bytes, bool]:
    """The body bytes that are ready (once the loop's clock reaches ``not_before``), joined, and
    whether more follow."""
    pieces: list[bytes] = []
    more = True
    message = await _next(queue, task)
    if message is not _END and message.get("more_body", False):
        wait = not_before - asyncio.get_running_loop().time()
        if wait > 0:
            await asyncio.sleep(wait)
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
