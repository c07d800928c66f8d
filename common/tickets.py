"""Assignment tickets and worker credentials: what the cluster secret proves between fairgate's pods.

The dispatcher signs each assignment (request id, tenant, worker, expiry, and the size it admitted:
prompt tokens and ``max_tokens``) with the cluster secret; a worker generates nothing without a valid
ticket that names it, serves no more than the ticket admitted, and takes each ticket once
(``TicketBook``). No one can skip the queue by calling a worker directly, replay an assignment, or
grow it past what was charged for. Workers in turn prove they hold the secret when they connect to
the dispatcher (``worker_token``): the proof names the worker and the address it will be sent
requests at, carries a one-time nonce, and is good for ``WORKER_TOKEN_TTL_S``; the dispatcher takes
each nonce once (``NonceBook``), so a captured proof cannot attach an impostor.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import secrets
from dataclasses import dataclass

from fairgate.common.rpc import fairgate_pb2 as pb


@dataclass(frozen=True, slots=True)
class TicketFields:
    request_id: str
    tenant: str
    worker_id: str
    expires_at: float
    prompt_tokens: int = 0  # the admitted size: the worker serves at most this
    max_tokens: int = 0
    cache_group: str = ""  # the prefix-cache salt's owner: the tenant's sharing group ("" : the tenant)
    priority: int = 0  # the engine's preemption rank (larger: preempted first), where the engine takes one
    adapter: str = ""  # the LoRA adapter it is served with ("": the base model): no other may be served
    adapter_path: str = ""  # where that adapter's weights are loaded from


def _encode(parts: list[str]) -> bytes:
    # Length-prefixed fields: no two different messages encode to the same bytes.
    return b"".join(f"{len(p.encode())}:".encode() + p.encode() for p in parts)


def _message(f: TicketFields) -> bytes:
    parts = [f.request_id, f.tenant, f.worker_id, repr(float(f.expires_at)), str(f.prompt_tokens), str(f.max_tokens)]
    parts += [f.cache_group, str(f.priority), f.adapter, f.adapter_path]
    return _encode(parts)


def sign(secret: bytes, fields: TicketFields) -> bytes:
    if not secret:
        raise ValueError("the cluster secret is empty")
    return hmac.new(secret, _message(fields), hashlib.sha256).digest()


def ticket_message(fields: TicketFields, signature: bytes) -> pb.Ticket:
    """The ticket as it travels to the worker (``GenerateRequest.ticket``)."""
    f = fields  # field by field: ``dataclasses.asdict`` deep-copies, once per request
    return pb.Ticket(
        request_id=f.request_id,
        tenant=f.tenant,
        worker_id=f.worker_id,
        expires_at=f.expires_at,
        prompt_tokens=f.prompt_tokens,
        max_tokens=f.max_tokens,
        cache_group=f.cache_group,
        priority=f.priority,
        adapter=f.adapter,
        adapter_path=f.adapter_path,
        signature=signature,
    )


def ticket_fields(ticket: pb.Ticket) -> TicketFields:
    return TicketFields(
        ticket.request_id,
        ticket.tenant,
        ticket.worker_id,
        ticket.expires_at,
        ticket.prompt_tokens,
        ticket.max_tokens,
        ticket.cache_group,
        ticket.priority,
        ticket.adapter,
        ticket.adapter_path,
    )


def check(secret: bytes, fields: TicketFields, signature: bytes, worker_id: str, now: float) -> str | None:
    """None when the ticket is valid for ``worker_id`` at ``now``, else why it is not."""
    if not hmac.compare_digest(sign(secret, fields), signature):
        return "bad ticket signature"
    if fields.worker_id != worker_id:
        return "ticket is for another worker"
    if now > fields.expires_at:
        return "ticket expired"
    return None


def check_size(fields: TicketFields, prompt_tokens: int, max_tokens: int) -> str | None:
    """None when a request stays within what its ticket admitted, else why not."""
    if max_tokens > fields.max_tokens:
        return f"max_tokens {max_tokens} is more than the {fields.max_tokens} admitted"
    if prompt_tokens > fields.prompt_tokens:
        return f"the prompt's {prompt_tokens} tokens are more than the {fields.prompt_tokens} admitted"
    return None


class _OnceBook:
    """Values seen once, remembered until they expire (so the book stays as small as the live window).
    Expired values leave in expiry order (a heap): each take costs O(log n), however many are live."""

    def __init__(self) -> None:
        self._seen: set[bytes | str] = set()
        self._expiry: list[tuple[float, bytes | str]] = []

    def take(self, value: bytes | str, expires_at: float, now: float) -> bool:
        """True the first time ``value`` is taken; False on every later try."""
        expiry = self._expiry
        while expiry and expiry[0][0] < now:
            self._seen.discard(heapq.heappop(expiry)[1])
        if value in self._seen:
            return False
        self._seen.add(value)
        heapq.heappush(expiry, (expires_at, value))
        return True

    def __len__(self) -> int:
        return len(self._seen)


class TicketBook(_OnceBook):
    """A worker's record of the tickets it served: each ticket (its signature) is taken once."""


class NonceBook(_OnceBook):
    """The dispatcher's record of the worker credentials it accepted: each nonce is taken once."""


WORKER_AUTH_HEADER = "x-fairgate-worker-auth"
WORKER_TOKEN_TTL_S = 60.0  # clock skew allowed between pods, and the life of one credential


def worker_token(secret: bytes, worker_id: str, address: str, now: float) -> str:
    """What a worker sends when it connects: a timestamp, a fresh nonce and an HMAC of (worker id,
    address, timestamp, nonce)."""
    stamp, nonce = f"{now:.0f}", secrets.token_hex(16)
    return f"{stamp}.{nonce}.{_worker_mac(secret, worker_id, address, stamp, nonce)}"


def check_worker_token(
    secret: bytes, worker_id: str, address: str, token: str, now: float, nonces: NonceBook | None = None
) -> str | None:
    """None when ``token`` proves the cluster secret for ``worker_id`` at ``address``, is recent and
    (with ``nonces``) was never used before; else why not."""
    stamp, _, rest = token.partition(".")
    nonce, _, mac = rest.partition(".")
    if (
        not stamp.isdigit()
        or not nonce
        or not hmac.compare_digest(_worker_mac(secret, worker_id, address, stamp, nonce), mac)
    ):
        return "bad worker credentials"
    if abs(now - int(stamp)) > WORKER_TOKEN_TTL_S:
        return "worker credentials too old"
    if nonces is not None and not nonces.take(nonce, int(stamp) + WORKER_TOKEN_TTL_S, now):
        return "worker credentials already used"
    return None


def _worker_mac(secret: bytes, worker_id: str, address: str, stamp: str, nonce: str) -> str:
    message = b"worker:" + _encode([worker_id, address, stamp, nonce])
    return hmac.new(secret, message, hashlib.sha256).hexdigest()
