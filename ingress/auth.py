"""Who is calling: the tenant owning an API key, or the admin.

Keys are checked by their SHA-256 hash; the admin key is compared in constant time. An ingress replica
asks the dispatcher (the one tenant registry) about keys it does not know and keeps answers for a few
seconds, so a tenant created or deleted through any replica is seen by all of them within that time.
"""

from __future__ import annotations

import hmac
import time

from fastapi import Request

from common.config import hash_key
from ingress.openai_api import ApiError


def bearer_key(request: Request) -> str:
    """The API key of ``Authorization: Bearer <key>`` (401 when there is none)."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
    return key.strip()


KEY_CACHE_S = 5.0
MAX_CACHED_KEYS = 100_000


class KeyCache:
    def __init__(self, known: dict[str, str], ttl_s: float = KEY_CACHE_S) -> None:
        self._ttl = ttl_s
        now = time.monotonic()
        self._entries: dict[str, tuple[str | None, float]] = {h: (name, now + ttl_s) for h, name in known.items()}

    def get(self, key_hash: str) -> tuple[bool, str | None]:
        """(found, tenant): found is False when the dispatcher must be asked."""
        entry = self._entries.get(key_hash)
        if entry is None or entry[1] < time.monotonic():
            return False, None
        return True, entry[0]

    def put(self, key_hash: str, tenant: str | None) -> None:
        if len(self._entries) >= MAX_CACHED_KEYS:  # unknown keys must not grow this without bound
            self._entries.clear()
        self._entries[key_hash] = (tenant, time.monotonic() + self._ttl)

    def forget_tenant(self, tenant: str) -> None:
        for h in [h for h, (name, _) in self._entries.items() if name == tenant]:
            del self._entries[h]


def is_admin_key(key: str, admin_key_hash: str) -> bool:
    return bool(admin_key_hash) and hmac.compare_digest(hash_key(key), admin_key_hash)
