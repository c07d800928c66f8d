"""The admin API's request bodies and the tenant-key cache of an ingress replica.

Keys are checked by their SHA-256 hash; the admin key is compared in constant time. An ingress replica
asks the dispatcher (the one tenant registry) about keys it does not know and keeps answers for a few
seconds, so a tenant created or deleted through any replica is seen by all of them within that time.
"""

from __future__ import annotations

import hmac
import secrets
import time
from typing import Any

from dispatcher.config import hash_key
from dispatcher.openai_api import ApiError

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


def tenant_change(body: Any, creating: bool) -> tuple[str | None, float | None, str | None]:
    """Validate a create/update body: returns (name, weight, new API key or None)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_request")
    allowed = {"name", "weight", "api_key"} if creating else {"weight", "api_key"}
    unknown = set(body) - allowed
    if unknown:
        raise ApiError(400, f"unknown field '{sorted(unknown)[0]}'", param=sorted(unknown)[0], code="invalid_request")
    name = body.get("name")
    if creating and not isinstance(name, str):
        raise ApiError(400, "missing required field 'name'", param="name", code="invalid_request")
    weight = body.get("weight")
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, int | float)):
        raise ApiError(400, "invalid 'weight': a positive number is needed", param="weight", code="invalid_request")
    key = body.get("api_key")
    if key is not None and (not isinstance(key, str) or len(key) < 16):
        raise ApiError(400, "invalid 'api_key': at least 16 characters", param="api_key", code="invalid_request")
    if creating and key is None:
        key = "fg-" + secrets.token_urlsafe(24)
    return name, None if weight is None else float(weight), key
