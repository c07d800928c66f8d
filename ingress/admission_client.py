"""The ingress's side of the dispatcher's admission endpoint: one call per request, all of a replica's
calls on one connection (``dispatcher/admission_service.py``).

The endpoint's address comes from the dispatcher actor and changes when it restarts; a call whose
connection breaks is asked again on a new one (``retry`` set, same id, so the request never runs
twice) until the dispatcher is back or ``wait_s`` has passed. Cancelling a call (the client left while
queued) withdraws the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from fairgate.common.frame_guard import HandshakeRefused
from fairgate.common.frames import ConnectionLost, MessageConnection, connect
from fairgate.common.rpc import fairgate_pb2 as pb
from fairgate.common.waits import within
from fairgate.dispatcher.admission_service import INTERNAL_ERROR, admission_key

Abandoned = Callable[[pb.SubmitRequest], None]


def _placed(reply: asyncio.Future[pb.SubmitReply]) -> bool:
    return reply.done() and not reply.cancelled() and reply.exception() is None and not reply.result().rejected


class DispatcherUnavailable(Exception):
    """The dispatcher did not come back within the wait."""


class AdmissionRefused(RuntimeError):
    """The dispatcher refused this ingress (a cluster secret of another gateway) or failed on a
    request: a fault of the deployment, not of the client's request."""


class _AdmissionLink(MessageConnection):
    """One connection; calls wait on it by request id."""

    incoming = pb.SubmitReply

    def __init__(self, abandoned: Abandoned) -> None:
        super().__init__()
        self._waiting: dict[str, asyncio.Future[pb.SubmitReply]] = {}
        self._abandoned = abandoned

    def on_message(self, reply: pb.SubmitReply) -> None:
        future = self._waiting.pop(reply.request_id, None)
        if future is not None and not future.done():
            future.set_result(reply)

    def on_ended(self, exc: Exception | None) -> None:
        if isinstance(exc, HandshakeRefused):  # every call on this connection fails: a deployment fault
            self._fail(AdmissionRefused(f"the dispatcher refused this ingress: {exc}"))
            return
        self._fail(ConnectionLost(str(exc) if exc else "the dispatcher closed the connection"))

    def _fail(self, exc: Exception) -> None:
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(exc)

    async def call(self, request: pb.SubmitRequest) -> pb.SubmitReply:
        rid = request.request_id
        future = asyncio.get_running_loop().create_future()
        earlier = self._waiting.get(rid)
        if earlier is not None and not earlier.done():
            earlier.set_exception(AdmissionRefused(f"request {rid} was submitted again while it waited"))
        self._waiting[rid] = future
        self.send_message(pb.AdmissionFrame(submit=request))
        try:
            return await future
        except asyncio.CancelledError:
            if self._waiting.get(rid) is future:
                del self._waiting[rid]
                if not self.closed:
                    self.send_message(pb.AdmissionFrame(withdraw=rid))
            elif _placed(future):  # placed just before the client left: free it now
                self._abandoned(request)
            raise


class AdmissionClient:
    def __init__(self, address: Callable[[], Awaitable[str]], secret: str, wait_s: float, abandoned: Abandoned) -> None:
        """``address``: asks the dispatcher actor where its endpoint is (waits out a restart itself);
        ``abandoned``: frees a request placed as its call was cancelled (the reply came, the caller
        had left)."""
        self._address = address
        self._abandoned = abandoned
        self._key = admission_key(secret.encode())
        self._wait_s = wait_s
        self._link: _AdmissionLink | None = None
        self._connecting: asyncio.Task[_AdmissionLink] | None = None

    async def submit(self, request: pb.SubmitRequest) -> pb.SubmitReply:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s
        delay = 0.1
        while True:
            link = self._link
            try:
                if link is None or link.closed:  # the actor may be restarting: its address waits for it
                    link = await within(self._connect(), max(0.1, deadline - loop.time()))
                reply = await link.call(request)
                if reply.rejected == INTERNAL_ERROR:
                    raise AdmissionRefused(reply.message)
                return reply
            except HandshakeRefused as exc:  # refused before the call was sent
                self._forget(link)
                raise AdmissionRefused(f"the dispatcher refused this ingress: {exc}") from None
            except (ConnectionLost, OSError, TimeoutError):
                self._forget(link)
            if loop.time() >= deadline:
                raise DispatcherUnavailable
            request.retry = True  # it may have been queued (or assigned) before the connection broke
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)

    async def _connect(self) -> _AdmissionLink:
        """One connection for all the calls that need it at once."""
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.get_running_loop().create_task(self._open())
        return await asyncio.shield(self._connecting)

    async def _open(self) -> _AdmissionLink:
        address = await self._address()
        link = await connect(address, lambda: _AdmissionLink(self._abandoned), self._key)
        self._link = link
        return link

    def _forget(self, link: _AdmissionLink | None) -> None:
        """The endpoint at the cached address is gone: the next call asks the actor again."""
        if link is not None and self._link is link:
            self._link = None

    async def close(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None
