"""The dispatcher's admission endpoint: the ingress's one call per request (docs/architecture.md).

Each ingress replica keeps one connection here (``common/frames.py``): it opens with the handshake of
``common/frame_guard.py`` (an HMAC, under a key derived from the cluster secret for this hop, of a
nonce the endpoint sends: no tenant has the key, and nothing a stranger sends is parsed); then a
``SubmitRequest`` frame per request, answered by a
``SubmitReply`` naming the request once it is assigned (or refused). Many requests wait on one
connection. A ``withdraw`` frame (the client left while queued) cancels the request's call, which
withdraws it; so does the connection breaking. Frames instead of gRPC: see ``common/frames.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fairgate.common.frame_guard import ADMISSION_HOP, Guard, hop_key
from fairgate.common.frames import MessageConnection, MessageServer
from fairgate.common.rpc import fairgate_pb2 as pb

log = logging.getLogger(__name__)

Admit = Callable[[pb.SubmitRequest], Awaitable[pb.SubmitReply]]


def admission_key(secret: bytes) -> bytes:
    """The key an ingress signs its hello to the admission endpoint with."""
    return hop_key(secret, ADMISSION_HOP)


def submit_args(request: pb.SubmitRequest) -> tuple[Any, ...]:
    """The request as the dispatcher reads it: (id, tenant, prompt tokens, max tokens, retry, key hash,
    model, prefix, block tokens, tier, adapter), with None for an absent key, model or tier (an empty
    tier is the client's own, not absent) and "" for the base model."""
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
        request.adapter,
    )


INTERNAL_ERROR = "internal_error"  # the dispatcher failed on the request (a bug: the client's 500)


class _AdmissionConnection(MessageConnection):
    incoming = pb.AdmissionFrame

    def __init__(self, admit: Admit, connections: set[_AdmissionConnection]) -> None:
        super().__init__(connections)
        self._admit = admit

    def on_message(self, message: pb.AdmissionFrame) -> None:
        kind = message.WhichOneof("kind")
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


class AdmissionServer(MessageServer):
    """The endpoint on its own port (it changes when the dispatcher restarts: the ingress asks the
    actor for it again); stopping it withdraws the waiting calls."""

    def __init__(self, admit: Admit, secret: bytes, max_frame_bytes: int) -> None:
        guard = Guard(admission_key(secret), max_frame_bytes)
        super().__init__(lambda connections: _AdmissionConnection(admit, connections), guard)
