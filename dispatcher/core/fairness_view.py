"""Fairness as operators see it (pure): Jain's index over service rates, the largest counter gap between
backlogged tenants, and the 2U bound it is held to (DESIGN: U = max(w_p x longest prompt, w_q x M),
here the cost of the longest prompt or of a full KV pool of output tokens)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dispatcher.core.costs import CostFunction


def jain_index(values: Iterable[float]) -> float | None:
    """(sum x)^2 / (n * sum x^2): 1 when all are equal, 1/n when one gets everything; None if empty."""
    xs = [max(0.0, float(x)) for x in values]
    square = sum(x * x for x in xs)
    if not xs or square == 0:
        return None
    return sum(xs) ** 2 / (len(xs) * square)


def backlogged_gap(counters: Mapping[str, float], backlogged: Iterable[str]) -> float:
    """The largest difference between the counters of tenants waiting now (0 with fewer than two)."""
    values = [counters[t] for t in backlogged if t in counters]
    return max(values) - min(values) if len(values) >= 2 else 0.0


def two_u(cost: CostFunction, longest_prompt: int, pool_tokens: int) -> float:
    """VTC's bound on the gap between backlogged tenants' (weight-normalised) service."""
    return 2 * max(cost.total(longest_prompt, 0), cost.total(0, pool_tokens) - cost.total(0, 0))
