"""Placement by LoRA adapter: the worker where the request's adapter is nearest (docs/architecture.md,
"Adapters")."""

from __future__ import annotations

from collections.abc import Sequence

from fairgate.core.model import Request
from fairgate.core.placement.base import BALANCE, BALANCE_DOC, PlacementRule, fullness, most_room, register
from fairgate.core.registry import Param
from fairgate.core.workers import WorkerSlot


@register
class AdapterAffinity(PlacementRule):
    """Among the workers that can take the request and are at most ``BALANCE`` of their pool fuller
    than the emptiest: the one where its adapter is nearest (in the engine's batch, then loaded on its
    GPU, then in its host memory: ``WorkerSlot.residency``), then the most room. A request for the base
    model goes where ``most-room`` puts it.

    The balance limit is what replicates a hot adapter: once the workers holding it are fuller than
    the others, its next requests load it on the emptiest, one more replica as its demand grows, at
    most as many as there are workers (and an engine's batch holds at most ``max_loras`` adapters).
    """

    name = "adapter-affinity"
    params = (Param("balance", float, BALANCE, BALANCE_DOC),)

    def __init__(self, balance: float = BALANCE) -> None:
        if not 0.0 <= balance <= 1.0:
            raise ValueError(f"placement adapter-affinity: balance must be in [0, 1], got {balance}")
        self.balance = balance

    def choose(self, fits: Sequence[WorkerSlot], request: Request | None) -> WorkerSlot:
        if request is None or not request.adapter:
            return min(fits, key=most_room)
        emptiest = min(fullness(w) for w in fits)
        near = [w for w in fits if fullness(w) <= emptiest + self.balance]
        adapter = request.adapter
        return min(near, key=lambda w: (-w.residency(adapter), *most_room(w)))
