"""Fairness figures (pure), one definition each for the simulator's report, the live page, ``/metrics``
and the tests: VTC's bound 2U, the largest counter gap between backlogged tenants, Jain's index, and
the weighted max-min fair shares that Jain's index is taken against when demand is known.

U (docs/architecture.md) is the most service one tenant can be charged ahead of another in one go: the charge of
the longest prompt at dispatch, or the output its requests in flight may still generate at the
costliest per-token charge, U = max(h(L, 0), M × max over k of h(n_p, k) - h(n_p, k - 1)). For the
linear cost this is max(w_p × L, w_q × M). M is the KV those requests may be expected to reach: the
pool itself for engines filled by reservation (the paper's), ``overcommit`` pools for engines filled
as they fill themselves (``in_flight_reach``). For the profiled cost the per-token charge grows with the prompt and the
output so far; it is affine in both, so its largest value over prompts up to L and outputs up to O is
at a corner of that box, and those four corners are what is evaluated.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from fairgate.core.costs import CostFunction


def in_flight_reach(pool_tokens: int, overcommit: float) -> int:
    """M: the KV the requests in flight on a pool of ``pool_tokens`` (all workers') may be expected to
    reach when each worker takes requests expected to reach ``overcommit`` pools. A tenant admitted
    while its counter was the smallest can be charged that much output afterwards, so the bound grows
    with it (docs/architecture.md has the run that shows it)."""
    return math.ceil(pool_tokens * overcommit)


def unit_u(cost: CostFunction, longest_prompt: int, longest_output: int, pool_tokens: int) -> float:
    """U for requests of prompts up to ``longest_prompt`` and outputs up to ``longest_output`` tokens
    that may reach ``pool_tokens`` of KV in flight (M: ``in_flight_reach``)."""
    total = cost.total
    last = max(1, longest_output)
    per_token = max(total(p, k) - total(p, k - 1) for p in {0, max(0, longest_prompt)} for k in {1, last})
    return max(total(longest_prompt, 0), per_token * pool_tokens)


def two_u(cost: CostFunction, longest_prompt: int, longest_output: int, pool_tokens: int) -> float:
    """VTC's bound 2U on the gap between two backlogged tenants' service (weight 1)."""
    return 2.0 * unit_u(cost, longest_prompt, longest_output, pool_tokens)


def engine_queue_slack(cost: CostFunction, longest_prompt: int, queued: int) -> float:
    """What the engines' own queues add to the bound: ``queued`` requests in all may wait inside the
    engines (each engine's queue depth, summed), charged at dispatch but not yet served. A tenant's
    service lags its counter by at most the dispatch charges of its requests in there, and all tenants'
    together by at most ``queued`` longest prompts; over an interval, at both ends: 2 × queued × h(L, 0).
    A preempted request's tokens were served and charged once, and its recomputation is neither
    service nor charged; what preemption makes possible, requests in flight beyond one pool, is in M."""
    return 2.0 * queued * cost.total(longest_prompt, 0)


def backlogged_gap(counters: Mapping[str, float], backlogged: Iterable[str]) -> float:
    """The largest difference between the counters of tenants waiting now (0 with fewer than two)."""
    values = [counters[t] for t in backlogged if t in counters]
    return max(values) - min(values) if len(values) >= 2 else 0.0


def jain_index(values: Iterable[float]) -> float | None:
    """(sum x)^2 / (n * sum x^2): 1 when all are equal, 1/n when one gets everything; None if empty."""
    xs = [max(0.0, float(x)) for x in values]
    square = sum(x * x for x in xs)
    if not xs or square == 0:
        return None
    return min(1.0, sum(xs) ** 2 / (len(xs) * square))  # rounding can pass 1 by an ulp when all are equal


def max_min_shares(demand: Sequence[float], weights: Sequence[float], capacity: float) -> tuple[list[float], float]:
    """Weighted max-min fair allocation of ``capacity`` by water-filling, and the fill level: a tenant
    asking for less than level × weight is under its share and gets all it asks for (``math.inf``
    demand: it takes whatever it is given)."""
    alloc = [0.0] * len(demand)
    active = [i for i, d in enumerate(demand) if d > 0]
    left = capacity
    while active:
        level = left / sum(weights[i] for i in active)
        capped = [i for i in active if demand[i] <= level * weights[i]]
        if not capped:
            for i in active:
                alloc[i] = level * weights[i]
            return alloc, level
        for i in capped:
            alloc[i] = demand[i]
            left -= demand[i]
        active = [i for i in active if i not in capped]
    return alloc, math.inf  # every demand is met: everyone is under its share


def fair_share_jain(service: Sequence[float], owed: Sequence[float]) -> float:
    """Jain's index of each tenant's service over what max-min fairness owes it (capped at 1): 1.0 when
    every tenant got its fair share given what it asked for, whatever the weights."""
    x = [min(s / o, 1.0) for s, o in zip(service, owed, strict=True) if o > 0]
    if not x:
        return 1.0
    index = jain_index(x)
    return 0.0 if index is None else index  # None: nobody owed anything got anything
