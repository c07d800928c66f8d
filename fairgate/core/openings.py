"""When each engine's next batch slots open: where a request that must wait inside an engine starts
soonest (docs/architecture.md, "Revocation").

A full engine starts the head of its queue when one of its running requests ends. Every running
request yields one token per step, so the steps until the k-th slot opens on a worker are the k-th
fewest output tokens its running requests have left. What a request has left is its expected output
less what it has generated: its ``max_tokens`` scaled by the share of ``max_tokens`` its tenant's
requests used lately (a tenant whose requests stop early is expected to stop early). Replicas of one
pool run the same engine, so steps compare across them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from fairgate.core.model import Request
from fairgate.core.predictors import MovingAveragePredictor
from fairgate.core.workers import WorkerSlot

PER_MILLE = 1000


class BudgetUse:
    """Per tenant, the mean share of ``max_tokens`` its last ``window`` finished requests generated
    (a new tenant: every tenant's; none known: all of it). Saved with the scheduler's state."""

    def __init__(self, window: int = 20) -> None:
        self._per_mille = MovingAveragePredictor(window)

    def observe(self, tenant: str, output_tokens: int, max_tokens: int) -> None:
        if max_tokens > 0:
            self._per_mille.observe(tenant, round(PER_MILLE * min(1.0, output_tokens / max_tokens)))

    def snapshot(self) -> dict[str, Any]:
        return self._per_mille.snapshot()

    def restore(self, data: dict[str, Any]) -> None:
        self._per_mille.restore(data)

    def expected_output(self, tenant: str, max_tokens: int) -> int:
        share = self._per_mille.predict(tenant, PER_MILLE, None)
        return max_tokens if not share else max(1, math.ceil(max_tokens * share / PER_MILLE))


def steps_left(req: Request, budget: BudgetUse) -> int:
    """Steps until running ``req`` is expected to end (one at least: it has not ended yet)."""
    return max(1, budget.expected_output(req.tenant, req.max_tokens) - req.output_tokens)


def running_steps_left(in_flight: Iterable[Request], budget: BudgetUse) -> dict[str, list[int]]:
    """Per worker, the steps each of its started requests has left, fewest first."""
    per_worker: dict[str, list[int]] = {}
    for req in in_flight:
        if req.started and req.worker is not None:
            per_worker.setdefault(req.worker, []).append(steps_left(req, budget))
    for steps in per_worker.values():
        steps.sort()
    return per_worker


def steps_to_start(slot: WorkerSlot, left: Sequence[int], ahead: int) -> float:
    """Steps until a request with ``ahead`` requests before it in ``slot``'s queue starts there: the
    (``ahead`` + 1)-th batch slot to open (a free one opens now). Infinite past what the running requests
    tell (the requests started meanwhile decide)."""
    free = 0 if slot.max_running is None else max(0, slot.max_running - slot.running)
    if ahead < free:
        return 0.0
    k = ahead - free
    return float(left[k]) if k < len(left) else math.inf
