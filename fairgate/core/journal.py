"""Durable state as a journal of changes: what changed since the last write, and the state again from
a base and the changes written after it.

The dispatcher's durable state (``snapshots.durable_state``, the quota book's snapshot) is a JSON object
whose large parts are collections of rows: tenants and tree nodes by name, charged requests by id,
quota usage and holds by key. Between two writes a second apart most rows are unchanged, so a write
carries only the rows that changed or went, and the top-level fields that changed. ``fold`` applies
changes to a base; ``changes`` checks its own result (the fold of its change equals the new state in
order and content, or the section is written whole), so a restart restores exactly what was last
written. Values are compared as JSON-able data: the writer keeps the last written state as decoded
from what it wrote, never a reference into live objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# how a section's rows are keyed: a mapping by its own keys, a list of objects by "name", a list of
# rows by their first element
_BY_KEY, _BY_NAME, _BY_FIRST = "key", "name", "first"


def changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any] | None:
    """What turns ``before`` into ``after`` (both JSON-able objects): ``{"put": {field: value},
    "drop": [field], "rows": {field: [kind, {key: row}, [dropped keys]]}}``; None when nothing changed."""
    put: dict[str, Any] = {}
    rows: dict[str, Any] = {}
    for field, value in after.items():
        if field not in before:
            put[field] = value
            continue
        old = before[field]
        if old == value:
            continue
        section = _row_changes(old, value)
        if section is None:
            put[field] = value
        else:
            rows[field] = section
    dropped = [field for field in before if field not in after]
    if not (put or rows or dropped):
        return None
    change: dict[str, Any] = {}
    if put:
        change["put"] = put
    if dropped:
        change["drop"] = dropped
    if rows:
        change["rows"] = rows
    return change


def fold(base: Mapping[str, Any], *changed: Mapping[str, Any]) -> dict[str, Any]:
    """The state after applying each change in turn to ``base`` (``base`` itself is left as it was)."""
    state = dict(base)
    for change in changed:
        for field in change.get("drop", ()):
            state.pop(field, None)
        for field, (kind, set_rows, dropped) in change.get("rows", {}).items():
            state[field] = _fold_rows(kind, state[field], set_rows, dropped)
        state.update(change.get("put", {}))
    return state


def _kind(value: Any) -> str | None:
    """How a section's rows are keyed, or None when it is one value (compared and written whole)."""
    if isinstance(value, dict):
        return _BY_KEY
    if not isinstance(value, list) or not value:
        return None
    if all(isinstance(row, dict) and isinstance(row.get("name"), str) for row in value):
        return _BY_NAME
    if all(isinstance(row, list) and row and isinstance(row[0], str) for row in value):
        return _BY_FIRST
    return None


def _keyed(kind: str, value: Any) -> dict[str, Any]:
    if kind == _BY_KEY:
        return dict(value)
    if kind == _BY_NAME:
        return {row["name"]: row for row in value}
    return {row[0]: row for row in value}


def _unkeyed(kind: str, rows: dict[str, Any]) -> Any:
    return rows if kind == _BY_KEY else list(rows.values())


def _row_changes(old: Any, new: Any) -> list[Any] | None:
    """The rows of a section that changed, or None when the section must go whole (not keyed rows, a
    key twice, or an order the fold would not rebuild)."""
    kind = _kind(new)
    if kind is None or (_kind(old) != kind and not (old == [] and kind != _BY_KEY)):
        return None
    old_rows = _keyed(kind, old) if old else {}
    new_rows = _keyed(kind, new)
    if len(new_rows) != len(new) or len(old_rows) != len(old):
        return None
    set_rows = {key: row for key, row in new_rows.items() if old_rows.get(key, _MISSING) != row}
    dropped = [key for key in old_rows if key not in new_rows]
    if len(set_rows) + len(dropped) >= len(new_rows):  # most of it changed: whole is as small
        return None
    kept = [key for key in old_rows if key in new_rows]
    added = [key for key in new_rows if key not in old_rows]
    if kept + added != list(new_rows):  # a kept row moved: the fold would misorder it
        return None
    return [kind, set_rows, dropped]


def _fold_rows(kind: str, current: Any, set_rows: Mapping[str, Any], dropped: list[str]) -> Any:
    rows = _keyed(kind, current) if current else {}
    for key in dropped:
        rows.pop(key, None)
    rows.update(set_rows)
    return _unkeyed(kind, rows)


_MISSING = object()


class JournalWriter:
    """Decides each write of one durable state: a change against the last write, or a fresh base when
    there is none yet or the changes written since the base hold more bytes than the base (so what a
    restart reads stays under twice the state). ``wrote`` confirms a write; after a failed write the
    next one is a base, since the store may hold the change or not."""

    def __init__(self, min_journal_bytes: int = 4096) -> None:
        self._min_journal_bytes = min_journal_bytes
        self._last: dict[str, Any] | None = None  # as decoded from what was written
        self._base_bytes = 0
        self._journal_bytes = 0
        self._pending: tuple[bool, str] | None = None

    def next(self, state: Mapping[str, Any]) -> tuple[bool, str] | None:
        """``(is_base, encoded)`` to write for ``state``, or None when nothing changed since the last write."""
        if self._last is not None:
            change = changes(self._last, state)
            if change is None:
                return None
            encoded = json.dumps(change)
            if self._journal_bytes + len(encoded) <= max(self._base_bytes, self._min_journal_bytes):
                self._pending = (False, encoded)
                return self._pending
        self._pending = (True, json.dumps(state))
        return self._pending

    def wrote(self) -> None:
        """The write ``next`` returned is stored."""
        if self._pending is None:
            return
        is_base, encoded = self._pending
        self._pending = None
        if is_base:
            self._last, self._base_bytes, self._journal_bytes = json.loads(encoded), len(encoded), 0
        elif self._last is not None:
            self._last = fold(self._last, json.loads(encoded))
            self._journal_bytes += len(encoded)

    def failed(self) -> None:
        """The write ``next`` returned may or may not be stored: start again from a base."""
        self._pending = None
        self._last = None
