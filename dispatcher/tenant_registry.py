"""Who the tenants are: names, API key hashes and weights, changed live through the admin API.

It lives in the dispatcher actor (one authority for every ingress replica) next to the scheduler,
which holds each tenant's weight and counters. Only SHA-256 hashes of keys are kept.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # the whole name (fullmatch: "$" lets "\n" end it)


class TenantError(ValueError):
    """An admin change that cannot be made; ``status`` is the HTTP status it maps to."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class TenantRecord:
    name: str
    key_hash: str
    weight: float = 1.0
    cache_group: str = ""  # shares cached prefixes with the tenants of this group ("": with no one)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TenantRegistry:
    def __init__(self, records: list[dict[str, Any]]) -> None:
        self._by_name: dict[str, TenantRecord] = {}
        self._by_hash: dict[str, str] = {}
        for r in records:
            self.create(r["name"], r["key_hash"], float(r.get("weight", 1.0)), str(r.get("cache_group") or ""))

    def lookup(self, key_hash: str) -> str | None:
        return self._by_hash.get(key_hash)

    def get(self, name: str) -> TenantRecord | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return list(self._by_name)

    def records(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self._by_name.values()]

    def create(self, name: str, key_hash: str, weight: float, cache_group: str = "") -> TenantRecord:
        if not _NAME.fullmatch(name or ""):
            raise TenantError(400, "tenant names are 1-64 letters, digits, '_', '.', '-', starting alphanumeric")
        _check_weight(weight)
        _check_group(cache_group)
        if name in self._by_name:
            raise TenantError(409, f"tenant {name!r} already exists")
        if key_hash in self._by_hash:
            raise TenantError(409, "that API key belongs to another tenant")
        record = self._by_name[name] = TenantRecord(name, key_hash, weight, cache_group)
        self._by_hash[key_hash] = name
        return record

    def update(
        self, name: str, weight: float | None = None, key_hash: str | None = None, cache_group: str | None = None
    ) -> TenantRecord:
        record = self._require(name)
        if cache_group is not None:
            _check_group(cache_group)
            record.cache_group = cache_group
        if weight is not None:
            _check_weight(weight)
            record.weight = weight
        if key_hash is not None and key_hash != record.key_hash:
            if key_hash in self._by_hash:
                raise TenantError(409, "that API key belongs to another tenant")
            del self._by_hash[record.key_hash]
            record.key_hash = key_hash
            self._by_hash[key_hash] = name
        return record

    def delete(self, name: str) -> None:
        record = self._require(name)
        del self._by_name[name]
        del self._by_hash[record.key_hash]

    def _require(self, name: str) -> TenantRecord:
        record = self._by_name.get(name)
        if record is None:
            raise TenantError(404, f"no tenant {name!r}")
        return record


def _check_group(group: str) -> None:
    if not isinstance(group, str) or len(group) > 64:
        raise TenantError(400, f"cache_group must be a name of at most 64 characters, got {group!r}")


def _check_weight(weight: float) -> None:
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight <= 1e6:
        raise TenantError(400, f"weight must be a positive number, got {weight!r}")
