"""Assignment tickets: the dispatcher signs (request id, tenant, worker, expiry) with the cluster
secret; a worker generates nothing without a valid ticket that names it. No one can skip the queue by
calling a worker directly. Workers in turn prove they hold the secret when they connect to the
dispatcher (``worker_token``), so nothing else can pose as a worker and be sent requests."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TicketFields:
    request_id: str
    tenant: str
    worker_id: str
    expires_at: float


def _message(f: TicketFields) -> bytes:
    # Length-prefixed fields: no two different tickets encode to the same bytes.
    parts = [f.request_id, f.tenant, f.worker_id, repr(float(f.expires_at))]
    return b"".join(f"{len(p.encode())}:".encode() + p.encode() for p in parts)


def sign(secret: bytes, fields: TicketFields) -> bytes:
    if not secret:
        raise ValueError("the cluster secret is empty")
    return hmac.new(secret, _message(fields), hashlib.sha256).digest()


def check(secret: bytes, fields: TicketFields, signature: bytes, worker_id: str, now: float) -> str | None:
    """None when the ticket is valid for ``worker_id`` at ``now``, else why it is not."""
    if not hmac.compare_digest(sign(secret, fields), signature):
        return "bad ticket signature"
    if fields.worker_id != worker_id:
        return "ticket is for another worker"
    if now > fields.expires_at:
        return "ticket expired"
    return None


WORKER_AUTH_HEADER = "x-fairgate-worker-auth"
MAX_CLOCK_SKEW_S = 300.0


def worker_token(secret: bytes, worker_id: str, now: float) -> str:
    """What a worker sends when it connects: a timestamp and an HMAC of (worker id, timestamp)."""
    stamp = f"{now:.0f}"
    return f"{stamp}.{_worker_mac(secret, worker_id, stamp)}"


def check_worker_token(secret: bytes, worker_id: str, token: str, now: float) -> str | None:
    """None when ``token`` proves the cluster secret for ``worker_id`` and is recent, else why not."""
    stamp, _, mac = token.partition(".")
    if not stamp.isdigit() or not hmac.compare_digest(_worker_mac(secret, worker_id, stamp), mac):
        return "bad worker credentials"
    if abs(now - int(stamp)) > MAX_CLOCK_SKEW_S:
        return "worker credentials too old"
    return None


def _worker_mac(secret: bytes, worker_id: str, stamp: str) -> str:
    message = f"worker:{len(worker_id)}:{worker_id}:{stamp}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()
