"""Who is calling: the tenant owning an API key, or the admin.

Keys are checked by their keyed hash (``common/key_hashing``); the admin key's is compared in constant
time. An ingress replica
asks the dispatcher (the one tenant registry) about keys it has never seen (within a budget of look-ups a
second, so random keys cannot flood the dispatcher) and keeps answers for a few seconds; a known key's
answer is renewed in the background, outside that budget, so random keys lock no one out. A revoked key is
refused at once all the same: the dispatcher checks the key again when a request is submitted.
"""

from __future__ import annotations

import hmac
import time
from collections import OrderedDict

from fastapi import Request

from fairgate.ingress.openai_api import ApiError


def bearer_key(request: Request) -> str:
    """The API key of ``Authorization: Bearer <key>`` (401 when there is none)."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
    return key.strip()


KEY_CACHE_S = 5.0
MAX_UNKNOWN_KEYS = 100_000
UNKNOWN_LOOKUPS_PER_S = 50.0  # dispatcher look-ups of keys never seen here, per ingress replica


class KeyCache:
    """Key hash -> tenant, with the keys the dispatcher knows kept apart from those it refused.

    Random keys only ever push out other refused keys (least recently used first, at most
    ``max_unknown``), and a known key's answer, once ``ttl_s`` old, is still used while it is renewed:
    renewing it never waits for, nor spends, the budget that unknown keys drain. A revoked or rotated
    key still runs nothing: the dispatcher checks the key again when a request is submitted.
    """

    def __init__(self, known: dict[str, str], ttl_s: float = KEY_CACHE_S, max_unknown: int = MAX_UNKNOWN_KEYS) -> None:
        self._ttl = ttl_s
        self._max_unknown = max_unknown
        now = time.monotonic()
        self._known: dict[str, tuple[str, float]] = {h: (name, now + ttl_s) for h, name in known.items()}
        self._unknown: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._known) + len(self._unknown)

    def get(self, key_hash: str, now: float | None = None) -> tuple[bool, str | None, bool]:
        """(found, tenant, stale): found is False when the dispatcher must be asked; stale is True
        for a known key whose answer should be renewed (it may still be used meanwhile)."""
        now = time.monotonic() if now is None else now
        known = self._known.get(key_hash)
        if known is not None:
            return True, known[0], known[1] < now
        refused = self._unknown.get(key_hash)
        if refused is None or refused < now:
            return False, None, False
        self._unknown.move_to_end(key_hash)
        return True, None, False

    def put(self, key_hash: str, tenant: str | None, now: float | None = None) -> None:
        expires = (time.monotonic() if now is None else now) + self._ttl
        if tenant is not None:
            self._unknown.pop(key_hash, None)
            self._known[key_hash] = (tenant, expires)
            return
        self._known.pop(key_hash, None)
        self._unknown[key_hash] = expires
        self._unknown.move_to_end(key_hash)
        while len(self._unknown) > self._max_unknown:
            self._unknown.popitem(last=False)

    def forget_tenant(self, tenant: str) -> None:
        for h in [h for h, (name, _) in self._known.items() if name == tenant]:
            del self._known[h]


class LookupBudget:
    """A token bucket for asking the dispatcher about keys the cache does not know: random keys from a
    client cost the dispatcher at most ``per_s`` calls a second through this replica. Beyond it a key
    not in the cache is refused (401) without asking; keys in use are cached and never wait for it."""

    def __init__(self, per_s: float = UNKNOWN_LOOKUPS_PER_S, burst: int = 100) -> None:
        self._rate, self._burst = per_s, float(burst)
        self._tokens, self._at = float(burst), None

    def take(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if self._at is not None:
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def is_admin_key(key_hash: str, admin_key_hash: str) -> bool:
    return bool(admin_key_hash) and hmac.compare_digest(key_hash, admin_key_hash)
