"""Token and money quotas per tenant or tree node and window (a minute, an hour, a day), counted
centrally and exactly: a request is admitted only if its largest possible use (its prompt and its
``max_tokens``; in money, at its model's prices, the prompt as if none of it were cached) fits what
every quota above it has left, that much is held while it runs, and its actual use replaces the hold
when it ends. So no quota is exceeded, whatever the number of ingress replicas or model pools
(one book serves every pool of a dispatcher). A request over quota is refused with the time its
window turns. Windows are fixed (aligned to the epoch), and a request counts in the window it was
admitted in.

A quota may also guarantee a minimum (``min_tokens``, ``min_cost``) inside the nearest quota above it
of the same window that limits the same thing (its parent quota): the part of its minimum it has not
used is kept from every request outside its subtree, so requests elsewhere under the parent may use
(borrow) whatever the parent has left beyond its children's unused minimums, and a child can always
still use its own. Checked at each admission, this keeps an invariant: a parent's window has left at
least the sum of its children's unused minimums (the configuration checks that they fit its maximum).

The book's usage and the holds of started requests are durable (``snapshot``); holds of requests not
yet started are dropped there, as their dispatch charges are, and taken again when they are
dispatched after a restart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

WINDOWS_S = {"minute": 60.0, "hour": 3600.0, "day": 86400.0}
PathOf = Callable[[str], Sequence[str]]  # a tenant or node -> it and the nodes above it, nearest first


def _alone(name: str) -> Sequence[str]:
    return (name,)


@dataclass(frozen=True)
class Prices:
    """A model's prices, in money per million tokens."""

    input: float = 0.0
    cached_input: float = 0.0
    output: float = 0.0

    def cost(self, prompt: int, cached: int, output: int) -> float:
        return ((prompt - cached) * self.input + cached * self.cached_input + output * self.output) / 1e6

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Prices:
        data = data or {}
        return cls(float(data.get("input", 0.0)), float(data.get("cached_input", 0.0)), float(data.get("output", 0.0)))


@dataclass(frozen=True)
class Amount:
    """Tokens and money together: what a request holds, uses or may use."""

    tokens: int = 0
    cost: float = 0.0


@dataclass(frozen=True)
class QuotaRule:
    node: str  # a tenant's name or a tree node's
    window: str  # minute, hour or day
    max_tokens: int | None = None  # prompt and output tokens in one window
    max_cost: float | None = None  # money in one window (at each model's prices)
    over: str = "reject"  # a request that could take it over: refused (reject) or served from spare capacity
    min_tokens: int | None = None  # tokens per window its parent quota keeps for it until it uses them
    min_cost: float | None = None  # the same in money

    def __post_init__(self) -> None:
        if self.over not in ("reject", "demote"):
            raise ValueError(f"quota on {self.node!r}: over must be reject or demote")
        if self.window not in WINDOWS_S:
            raise ValueError(f"quota on {self.node!r}: window must be one of {', '.join(WINDOWS_S)}")
        if self.max_tokens is None and self.max_cost is None and self.min_tokens is None and self.min_cost is None:
            raise ValueError(f"quota on {self.node!r}: give max_tokens, max_cost, a minimum or several")
        for low, high, what in ((self.min_tokens, self.max_tokens, "tokens"), (self.min_cost, self.max_cost, "cost")):
            if low is not None and (low < 0 or (high is not None and low > high)):
                raise ValueError(f"quota on {self.node!r}: min_{what} must be between 0 and max_{what}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"quota on {self.node!r}: max_tokens must be at least 1")
        if self.max_cost is not None and not self.max_cost > 0:
            raise ValueError(f"quota on {self.node!r}: max_cost must be positive")

    @property
    def key(self) -> str:
        return f"{self.node}/{self.window}"

    def window_of(self, now: float) -> int:
        return math.floor(now / WINDOWS_S[self.window])

    def window_end(self, index: int) -> float:
        return (index + 1) * WINDOWS_S[self.window]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "window": self.window,
            "max_tokens": self.max_tokens,
            "max_cost": self.max_cost,
            "over": self.over,
            "min_tokens": self.min_tokens,
            "min_cost": self.min_cost,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuotaRule:
        tokens, cost = data.get("max_tokens"), data.get("max_cost")
        low_tokens, low_cost = data.get("min_tokens"), data.get("min_cost")
        return cls(
            str(data["node"]),
            str(data["window"]),
            None if tokens is None else int(tokens),
            None if cost is None else float(cost),
            str(data.get("over") or "reject"),
            None if low_tokens is None else int(low_tokens),
            None if low_cost is None else float(low_cost),
        )

    def unused_minimum(self, usage: Usage) -> Amount:
        """What of its minimum its window has not used or held yet."""
        tokens = 0 if self.min_tokens is None else max(0, self.min_tokens - usage.used - usage.held)
        cost = 0.0 if self.min_cost is None else max(0.0, self.min_cost - usage.used_cost - usage.held_cost)
        return Amount(tokens, cost)

    def tokens_left(self, usage: Usage) -> int | None:
        """What the window has left in tokens (None: no token limit)."""
        return None if self.max_tokens is None else max(0, self.max_tokens - usage.used - usage.held)

    def cost_left(self, usage: Usage) -> float | None:
        """What the window has left in money (None: no money limit)."""
        return None if self.max_cost is None else max(0.0, self.max_cost - usage.used_cost - usage.held_cost)

    def exceeded(self, usage: Usage, more: Amount, kept: Amount = Amount()) -> bool:
        """Whether ``more`` on top of what its window used and holds would exceed this quota, ``kept``
        (its children's unused minimums) set aside."""
        tokens, cost = self.tokens_left(usage), self.cost_left(usage)
        return (tokens is not None and more.tokens > tokens - kept.tokens) or (
            cost is not None and more.cost > cost - kept.cost + 1e-12
        )


@dataclass
class Usage:
    """One rule's current window: tokens used by requests that ended, and held by those running."""

    window: int = -1
    used: int = 0
    held: int = 0
    used_cost: float = 0.0
    held_cost: float = 0.0

    def add(self, held: Amount, used: Amount) -> None:
        self.held += held.tokens
        self.held_cost += held.cost
        self.used += used.tokens
        self.used_cost += used.cost


@dataclass
class Hold:
    amount: Amount
    windows: dict[str, int] = field(default_factory=dict)  # rule key -> the window it was held in


@dataclass(frozen=True)
class Refusal:
    rule: QuotaRule
    retry_after_s: float  # until the rule's window turns
    left: str  # what the window has left, in words (and what of it is kept for others' minimums)


class QuotaBook:
    def __init__(self, rules: Iterable[QuotaRule] = ()) -> None:
        self.rules: dict[str, list[QuotaRule]] = {}
        for rule in rules:
            self.rules.setdefault(rule.node, []).append(rule)
        self._guaranteed = [r for rs in self.rules.values() for r in rs if r.min_tokens or r.min_cost]
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
            self._usage[rule.key] = usage = self._fresh(rule.key, index, Amount())
        return usage

    def _fresh(self, key: str, window: int, used: Amount) -> Usage:
        """A rule's usage of ``window``: ``used``, and what the holds taken in that window hold."""
        held = [h.amount for h in self._holds.values() if h.windows.get(key) == window]
        return Usage(window, used.tokens, sum(a.tokens for a in held), used.cost, sum(a.cost for a in held))

    def refusal(self, names: Sequence[str], most: Amount, now: float, path_of: PathOf = _alone) -> Refusal | None:
        """A quota of ``names`` that ``most`` more would exceed now, its children's unused minimums
        outside ``names`` set aside (one that rejects before one that demotes), or None. ``path_of``:
        where each quota's node sits in the tree (without it no minimum is kept)."""
        demoting = None
        for rule in self._applying(names):
            usage = self._current(rule, now)
            kept = self._kept(rule, names, now, path_of)
            if rule.exceeded(usage, most, kept):
                left = _left(rule, usage) + _kept_words(kept)
                refusal = Refusal(rule, max(1.0, rule.window_end(usage.window) - now), left)
                if rule.over == "reject":
                    return refusal
                demoting = demoting or refusal
        return demoting

    def _kept(self, parent: QuotaRule, names: Sequence[str], now: float, path_of: PathOf) -> Amount:
        """The unused minimums of the quotas whose parent quota is ``parent``, except those of the
        nodes a request of ``names`` is under (its own it may use)."""
        tokens, cost = 0, 0.0
        for rule in self._guaranteed:
            if rule.window != parent.window or rule.node in names:
                continue
            path = path_of(rule.node)
            unused = rule.unused_minimum(self._current(rule, now))
            if unused.tokens and self._parent_node(path, rule.window, "max_tokens") == parent.node:
                tokens += unused.tokens
            if unused.cost and self._parent_node(path, rule.window, "max_cost") == parent.node:
                cost += unused.cost
        return Amount(tokens, cost)

    def _parent_node(self, path: Sequence[str], window: str, limit: str) -> str | None:
        """The nearest node above ``path[0]`` with a quota of ``window`` that has ``limit``."""
        for name in path[1:]:
            if any(r.window == window and getattr(r, limit) is not None for r in self.rules.get(name, ())):
                return name
        return None

    def hold(self, request_id: str, names: Iterable[str], most: Amount, now: float) -> None:
        """Hold ``most`` for a request dispatched now, in every quota of ``names``."""
        hold = Hold(most)
        for rule in self._applying(names):
            usage = self._current(rule, now)
            usage.add(most, Amount())
            hold.windows[rule.key] = usage.window
        if hold.windows:
            self._holds[request_id] = hold

    def holding(self, request_id: str) -> bool:
        return request_id in self._holds

    def release(self, request_id: str) -> None:
        """A request that never ran (refunded): its hold goes."""
        self.settle(request_id, Amount(), (), 0.0)

    def settle(self, request_id: str, used: Amount, names: Iterable[str], now: float) -> None:
        """A request ended having used ``used``: it replaces its hold, in the windows it was held in.
        One with no hold (it was dispatched after the state this book was restored from was saved)
        counts in the quotas of ``names`` now."""
        hold = self._holds.pop(request_id, None)
        if hold is None:
            for rule in self._applying(names):
                self._current(rule, now).add(Amount(), used)
            return
        back = Amount(-hold.amount.tokens, -hold.amount.cost)
        for key, window in hold.windows.items():
            usage = self._usage.get(key)
            if usage is not None and usage.window == window:
                usage.add(back, used)

    def view(self, names: Iterable[str] | None, now: float) -> list[dict[str, Any]]:
        """Each quota (of ``names``; None: all) with what its window has used, holds and has left."""
        rules = self._applying(names) if names is not None else [r for rs in self.rules.values() for r in rs]
        rows = []
        for rule in rules:
            usage = self._current(rule, now)
            tokens, cost = rule.tokens_left(usage), rule.cost_left(usage)
            row = rule.to_dict() | {"used_tokens": usage.used, "held_tokens": usage.held}
            if tokens is not None:
                row["remaining_tokens"] = tokens
            row |= {"used_cost": round(usage.used_cost, 9), "held_cost": round(usage.held_cost, 9)}
            if cost is not None:
                row["remaining_cost"] = round(cost, 9)
            if rule.min_tokens is not None or rule.min_cost is not None:
                unused = rule.unused_minimum(usage)
                row |= {"unused_min_tokens": unused.tokens, "unused_min_cost": round(unused.cost, 9)}
            rows.append(row | {"resets_in_s": rule.window_end(usage.window) - now})
        return rows

    def snapshot(self, started: Iterable[str]) -> dict[str, Any]:
        """Usage per rule and the holds of the requests in ``started`` (the rest are dropped, as their
        dispatch charges are in the durable state)."""
        keep = set(started)
        return {
            "usage": {key: [u.window, u.used, u.used_cost] for key, u in self._usage.items()},
            "holds": {
                rid: [h.amount.tokens, h.amount.cost, h.windows] for rid, h in self._holds.items() if rid in keep
            },
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        self._holds = {
            rid: Hold(Amount(int(tokens), float(cost)), {k: int(w) for k, w in windows.items()})
            for rid, (tokens, cost, windows) in data.get("holds", {}).items()
        }
        self._usage = {
            key: self._fresh(key, int(window), Amount(int(used), float(used_cost)))
            for key, (window, used, used_cost) in data.get("usage", {}).items()
        }


def _left(rule: QuotaRule, usage: Usage) -> str:
    tokens, cost = rule.tokens_left(usage), rule.cost_left(usage)
    parts = [] if tokens is None else [f"{tokens} tokens"]
    return " and ".join(parts if cost is None else [*parts, f"{cost:.6f} in money"])


def _kept_words(kept: Amount) -> str:
    parts = ([f"{kept.tokens} tokens"] if kept.tokens else []) + ([f"{kept.cost:.6f} in money"] if kept.cost else [])
    return f", of which {' and '.join(parts)} kept for other nodes' minimums" if parts else ""
