"""The default placement: the worker with the most room."""

from __future__ import annotations

from collections.abc import Sequence

from fairgate.core.model import Request
from fairgate.core.placement.base import PlacementRule, most_room, register
from fairgate.core.workers import WorkerSlot

SCAN = 32  # workers that fit a request, looked at per decision at most


@register
class MostRoom(PlacementRule):
    """The least prompt work assigned for the engine's next step (not yet started there), then the most
    free KV room, the fewest running requests, the lowest id (deterministic).

    Spreads a burst over the engines (each request waits for the prefill ahead of it in its step) and
    load so that the next large request still finds room somewhere; blind to prefix caches.
    Where more than ``SCAN`` workers could take a request, it chooses among the first ``SCAN`` found,
    those that could take work longest first: a decision's work stays the same as the fleet grows.
    """

    name = "most-room"
    candidates = SCAN

    def choose(self, fits: Sequence[WorkerSlot], request: Request | None) -> WorkerSlot:
        return min(fits, key=most_room)
