"""Compare two schedulers field by field, through every part they hold: what a restore left behind.

A snapshot that omits some part's field restores a scheduler that differs from the original in that
field, whether or not the events so far made it matter; the conformance suite walks both after every
restore. A few fields are rebuilt from others by design (caches, a heap kept lazily) and are named
here; a few containers are unordered by design (their order decides nothing).
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from typing import Any

# (class, field): derived from the rest, rebuilt on restore or on first use
REBUILT = {
    ("PrefixIndex", "_last"),  # the last question's answer, per worker
    ("PrefixIndex", "_tiers_version"),  # versions that invalidate that answer
    ("WorkerCache", "version"),
    ("WaitingSet", "_heap"),  # live entries with keys that may lag (re-keyed at the top); ``_live`` holds them
    ("WorkerTable", "_active"),  # the slots not draining
    ("WorkerTable", "_draining"),  # and those draining
    ("WorkerTable", "largest_pool"),
    ("WorkerSlot", "watcher"),  # its table
}
# (class, field): a mapping whose order decides nothing (compared as a mapping)
UNORDERED = {
    ("Continuations", "_by_block"),  # extensions are taken by submission order
    ("TreeNode", "kids"),  # members are found by name; who goes first is the waiting set's to say
}


def differences(a: Any, b: Any, path: str = "s", limit: int = 20) -> list[str]:
    """Where ``a`` and ``b`` differ (at most ``limit`` places), as paths from the scheduler."""
    found: list[str] = []
    _walk(a, b, path, found, set(), limit)
    return found


def _walk_unordered(a: Any, b: Any, path: str, found: list[str], seen: set[tuple[int, int]], limit: int) -> None:
    """As ``_walk``, but mappings (and the mappings they hold) are compared without their order."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        _walk(a, b, path, found, seen, limit)
        return
    if set(a) != set(b):
        found.append(f"{path}: keys {sorted(map(str, set(a) ^ set(b)))[:5]} on one side only")
        return
    for key in a:
        _walk_unordered(a[key], b[key], f"{path}[{key!r}]", found, seen, limit)


def _fields(obj: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(getattr(obj, "__dict__", {}))
    for klass in type(obj).__mro__:
        for name in getattr(klass, "__slots__", ()):
            if hasattr(obj, name):
                fields[name] = getattr(obj, name)
    return fields


def _walk(a: Any, b: Any, path: str, found: list[str], seen: set[tuple[int, int]], limit: int) -> None:
    if len(found) >= limit:
        return
    if type(a) is not type(b):
        found.append(f"{path}: {type(a).__name__} != {type(b).__name__}")
        return
    if a is None or isinstance(a, (bool, int, float, str, bytes)):
        if a != b:
            found.append(f"{path}: {a!r} != {b!r}")
        return
    if callable(a) and not hasattr(a, "__dict__") and not hasattr(type(a), "__slots__"):
        return  # a function or bound method (a key, a cost): code, not state
    pair = (id(a), id(b))
    if pair in seen:
        return
    seen.add(pair)
    if isinstance(a, random.Random):
        if a.getstate() != b.getstate():
            found.append(f"{path}: random state differs")
        return
    if isinstance(a, (dict, OrderedDict)):
        if list(a) != list(b):
            if set(a) != set(b):
                found.append(f"{path}: keys {sorted(map(str, set(a) ^ set(b)))[:5]} on one side only")
                return
            found.append(f"{path}: same keys in another order")
            return
        for key in a:
            _walk(a[key], b[key], f"{path}[{key!r}]", found, seen, limit)
        return
    if isinstance(a, (list, tuple, deque)):
        if len(a) != len(b):
            found.append(f"{path}: {len(a)} items != {len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _walk(x, y, f"{path}[{i}]", found, seen, limit)
        return
    if isinstance(a, (set, frozenset)):
        if a != b:
            found.append(f"{path}: {sorted(map(str, a ^ b))[:5]} on one side only")
        return
    fa, fb = _fields(a), _fields(b)
    kind = type(a).__name__
    for name in sorted(set(fa) | set(fb)):
        if (kind, name) in REBUILT:
            continue
        x, y = fa.get(name), fb.get(name)
        if (kind, name) in UNORDERED:
            _walk_unordered(x, y, f"{path}.{name}", found, seen, limit)
            continue
        _walk(x, y, f"{path}.{name}", found, seen, limit)
