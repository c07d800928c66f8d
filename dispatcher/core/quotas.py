"""Token quotas per tenant or tree node and window (a minute, an hour, a day), counted centrally and
exactly: a request is admitted only if its largest possible use (its prompt and its ``max_tokens``)
fits what every quota above it has left, that much is held while it runs, and its actual use replaces
the hold when it ends. So no quota is exceeded, whatever the number of ingress replicas or model pools
(one book serves every pool of a dispatcher). A request over quota is refused with the time its
window turns. Windows are fixed (aligned to the epoch), and a request counts in the window it was
admitted in.

The book's usage and the holds of started requests are durable (``snapshot``); holds of requests not
yet started are dropped there, as their dispatch charges are, and taken again when they are
dispatched after a restart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

WINDOWS_S = {"minute": 60.0, "hour": 3600.0, "day": 86400.0}


@dataclass(frozen=True)
class QuotaRule:
    node: str  # a tenant's name or a tree node's
    window: str  # minute, hour or day
    max_tokens: int  # prompt and output tokens in one window

    def __post_init__(self) -> None:
        if self.window not in WINDOWS_S:
            raise ValueError(f"quota on {self.node!r}: window must be one of {', '.join(WINDOWS_S)}")
        if self.max_tokens < 1:
            raise ValueError(f"quota on {self.node!r}: max_tokens must be at least 1")

    @property
    def key(self) -> str:
        return f"{self.node}/{self.window}"

    def window_of(self, now: float) -> int:
        return math.floor(now / WINDOWS_S[self.window])

    def window_end(self, index: int) -> float:
        return (index + 1) * WINDOWS_S[self.window]

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "window": self.window, "max_tokens": self.max_tokens}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuotaRule:
        return cls(str(data["node"]), str(data["window"]), int(data["max_tokens"]))


@dataclass
class Usage:
    """One rule's current window: tokens used by requests that ended, and held by those running."""

    window: int = -1
    used: int = 0
    held: int = 0


@dataclass
class Hold:
    tokens: int
    windows: dict[str, int] = field(default_factory=dict)  # rule key -> the window it was held in


@dataclass(frozen=True)
class Refusal:
    rule: QuotaRule
    retry_after_s: float  # until the rule's window turns
    left: int  # tokens the window has left


class QuotaBook:
    def __init__(self, rules: Iterable[QuotaRule] = ()) -> None:
        self.rules: dict[str, list[QuotaRule]] = {}
        for rule in rules:
            self.rules.setdefault(rule.node, []).append(rule)
        self._usage: dict[str, Usage] = {}
        self._holds: dict[str, Hold] = {}

    def __bool__(self) -> bool:
        return bool(self.rules)

    def _applying(self, names: Iterable[str]) -> list[QuotaRule]:
        return [rule for name in names for rule in self.rules.get(name, ())]

    def _current(self, rule: QuotaRule, now: float) -> Usage:
        usage = self._usage.setdefault(rule.key, Usage())
        index = rule.window_of(now)
        if usage.window != index:  # the window turned: what ran in the last one is not counted again
            usage.window, usage.used = index, 0
            usage.held = sum(h.tokens for h in self._holds.values() if h.windows.get(rule.key) == index)
        return usage

    def refusal(self, names: Iterable[str], tokens: int, now: float) -> Refusal | None:
        """The first quota of ``names`` that ``tokens`` more would exceed now, or None."""
        for rule in self._applying(names):
            usage = self._current(rule, now)
            left = rule.max_tokens - usage.used - usage.held
            if tokens > left:
                return Refusal(rule, max(1.0, rule.window_end(usage.window) - now), max(0, left))
        return None

    def hold(self, request_id: str, names: Iterable[str], tokens: int, now: float) -> None:
        """Hold ``tokens`` for a request dispatched now, in every quota of ``names``."""
        hold = Hold(tokens)
        for rule in self._applying(names):
            usage = self._current(rule, now)
            usage.held += tokens
            hold.windows[rule.key] = usage.window
        if hold.windows:
            self._holds[request_id] = hold

    def release(self, request_id: str) -> None:
        """A request that never ran (refunded): its hold goes."""
        self.settle(request_id, 0, (), 0.0)

    def settle(self, request_id: str, used: int, names: Iterable[str], now: float) -> None:
        """A request ended having used ``used`` tokens: they replace its hold, in the windows it was
        held in. One with no hold (it was dispatched after the state this book was restored from was
        saved) counts in the quotas of ``names`` now."""
        hold = self._holds.pop(request_id, None)
        if hold is None:
            for rule in self._applying(names):
                self._current(rule, now).used += used
            return
        for key, window in hold.windows.items():
            usage = self._usage.get(key)
            if usage is not None and usage.window == window:
                usage.held -= hold.tokens
                usage.used += used

    def view(self, names: Iterable[str] | None, now: float) -> list[dict[str, Any]]:
        """Each quota (of ``names``; None: all) with what its window has used, holds and has left."""
        rules = self._applying(names) if names is not None else [r for rs in self.rules.values() for r in rs]
        rows = []
        for rule in rules:
            usage = self._current(rule, now)
            rows.append(
                rule.to_dict()
                | {
                    "used_tokens": usage.used,
                    "held_tokens": usage.held,
                    "remaining_tokens": max(0, rule.max_tokens - usage.used - usage.held),
                    "resets_in_s": rule.window_end(usage.window) - now,
                }
            )
        return rows

    def snapshot(self, started: Iterable[str]) -> dict[str, Any]:
        """Usage per rule and the holds of the requests in ``started`` (the rest are dropped, as their
        dispatch charges are in the durable state)."""
        keep = set(started)
        return {
            "usage": {key: [u.window, u.used] for key, u in self._usage.items()},
            "holds": {rid: [h.tokens, h.windows] for rid, h in self._holds.items() if rid in keep},
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        self._holds = {
            rid: Hold(int(tokens), {k: int(w) for k, w in windows.items()})
            for rid, (tokens, windows) in data.get("holds", {}).items()
        }
        self._usage = {}
        for key, (window, used) in data.get("usage", {}).items():
            held = sum(h.tokens for h in self._holds.values() if h.windows.get(key) == int(window))
            self._usage[key] = Usage(int(window), int(used), held)
