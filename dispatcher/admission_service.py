"""The dispatcher's admission endpoint: the ingress's one call per request (docs/architecture.md).

Each ingress replica keeps one connection here (``common/frames.py``): its first frame is the ingress
token, derived from the cluster secret, which no tenant has (a connection without it is answered
``permission_denied`` and closed); then a ``SubmitRequest`` frame per request, answered by a
``SubmitReply`` naming the request once it is assigned (or refused). Many requests wait on one
connection. A ``withdraw`` frame (the client left while queued) cancels the request's call, which
withdraws it; so does the connection breaking. Frames instead of gRPC: see ``common/frames.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from common.frames import MessageConnection, listen
from common.rpc import fairgate_pb2 as pb

log = logging.getLogger(__name__)

Admit = Callable[[pb.SubmitRequest], Awaitable[pb.SubmitReply]]


def ingress_token(secret: bytes) -> str:
    """What an ingress presents: a key derived from the cluster secret for this purpose only."""
    return hmac.new(secret, b"fairgate-admission-v1", hashlib.sha256).hexdigest()


def submit_args(request: pb.SubmitRequest) -> tuple[Any, ...]:
    """The request as the dispatcher reads it: (id, tenant, prompt tokens, max tokens, retry, key hash,
    model, prefix, block tokens, tier), with None for an absent key, model or tier (an empty tier is
    the client's own, not absent)."""
    return (
        request.request_id,
        request.tenant,
        request.prompt_tokens,
        request.max_tokens,
        request.retry,
        request.key_hash or None,
        request.model or None,
        tuple(request.prefix),
        request.block_tokens,
        request.tier if request.HasField("tier") else None,
    )


NOT_AN_INGRESS = "permission_denied"  # a reply naming no request: the connection's token was refused
INTERNAL_ERROR = "internal_error"  # the dispatcher failed on the request (a bug: the client's 500)


class _AdmissionConnection(MessageConnection):
    incoming = pb.AdmissionFrame

    def __init__(self, admit: Admit, token: str, connections: set[_AdmissionConnection]) -> None:
        super().__init__(connections)
        self._admit = admit
        self._token = token
        self._trusted = False

    def on_message(self, message: pb.AdmissionFrame) -> None:
        kind = message.WhichOneof("kind")
        if not self._trusted:
            if kind == "token" and hmac.compare_digest(message.token.encode(), self._token.encode()):
                self._trusted = True
                return
            self.send_message(pb.SubmitReply(rejected=NOT_AN_INGRESS, message="not an ingress of this gateway"))
            self.close()
            return
        if kind == "submit":  # asked again before the first answer: the first is withdrawn
            self.start(message.submit.request_id, self._answer(message.submit))
        elif kind == "withdraw":
            self.withdraw(message.withdraw)

    async def _answer(self, request: pb.SubmitRequest) -> None:
        rid = request.request_id
        try:
            reply = await self._admit(request)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("admission: the dispatcher failed on %s", rid)
            reply = pb.SubmitReply(rejected=INTERNAL_ERROR, message="the dispatcher failed on this request")
        reply.request_id = rid
        if not self.closed:
            self.send_message(reply)


class AdmissionServer:
    """The endpoint on its own port (it changes when the dispatcher restarts: the ingress asks the
    actor for it again)."""

    def __init__(self, admit: Admit, secret: bytes) -> None:
        self._admit = admit
        self._token = ingress_token(secret)
        self._server: asyncio.Server | None = None
        self._connections: set[_AdmissionConnection] = set()
        self.address = ""

    async def start(self, host: str) -> str:
        self._server, self.address = await listen(
            host, lambda: _AdmissionConnection(self._admit, self._token, self._connections)
        )
        return self.address

    async def stop(self) -> None:
        """Close the endpoint and every connection (their waiting calls are withdrawn)."""
        if self._server is None:
            return
        self._server.close()
        for conn in list(self._connections):
            conn.abort()
        self._server = None
