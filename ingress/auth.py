"""Who is calling: the tenant owning an API key, or the admin.

Keys are checked by their SHA-256 hash; the admin key is compared in constant time. An ingress replica
asks the dispatcher (the one tenant registry) about keys it does not know (within a budget of look-ups a
second, so random keys cannot flood the dispatcher) and keeps answers for a few seconds. A revoked key is
refused at once all the same: the dispatcher checks the key again when a request is submitted.
"""

from __future__ import annotations

import hmac
import time
from collections import OrderedDict

from fastapi import Request

from common.sections import hash_key
from ingress.openai_api import ApiError


def bearer_key(request: Request) -> str:
    """The API key of ``Authorization: Bearer <key>`` (401 when there is none)."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
    return key.strip()


KEY_CACHE_S = 5.0
MAX_CACHED_KEYS = 100_000
UNKNOWN_LOOKUPS_PER_S = 50.0  # dispatcher look-ups of keys not in the cache, per ingress replica


class KeyCache:
    """Key hash -> tenant (None: unknown), each answer kept ``ttl_s``; least recently used first out
    when full, so a flood of unknown keys pushes out other unknown keys, not the keys in use."""

    def __init__(self, known: dict[str, str], ttl_s: float = KEY_CACHE_S, max_entries: int = MAX_CACHED_KEYS) -> None:
        self._ttl = ttl_s
        self._max = max_entries
        now = time.monotonic()
        self._entries: OrderedDict[str, tuple[str | None, float]] = OrderedDict(
            (h, (name, now + ttl_s)) for h, name in known.items()
        )

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key_hash: str) -> tuple[bool, str | None]:
        """(found, tenant): found is False when the dispatcher must be asked."""
        entry = self._entries.get(key_hash)
        if entry is None or entry[1] < time.monotonic():
            return False, None
        self._entries.move_to_end(key_hash)
        return True, entry[0]

    def put(self, key_hash: str, tenant: str | None) -> None:
        self._entries[key_hash] = (tenant, time.monotonic() + self._ttl)
        self._entries.move_to_end(key_hash)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def forget_tenant(self, tenant: str) -> None:
        for h in [h for h, (name, _) in self._entries.items() if name == tenant]:
            del self._entries[h]


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


def is_admin_key(key: str, admin_key_hash: str) -> bool:
    return bool(admin_key_hash) and hmac.compare_digest(hash_key(key), admin_key_hash)
