"""The interface of a placement rule, and the registry of rules by name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from fairgate.core.model import Request
from fairgate.core.prefix_index import PrefixIndex
from fairgate.core.registry import Registry
from fairgate.core.workers import WorkerSlot

PLACEMENTS: Registry[type[PlacementRule]] = Registry("placement rule")
register = PLACEMENTS.register


def fullness(w: WorkerSlot) -> float:
    """The share of its pool a worker has no room in (used, kept by its watermark, or assigned)."""
    return 1.0 - w.room() / w.kv_tokens


def most_room(w: WorkerSlot) -> tuple[int, int, str]:
    """The order of ``most-room``: the most room, then the fewest running, then the id."""
    return (-w.room(), w.running + w.pending_count, w.id)


class PlacementRule:
    """Choose one worker among ``fits`` (never empty; every one of them can start the request now).
    ``request`` is None when the scheduler only asks whether a request of some size would fit."""

    name: ClassVar[str]

    def attach(self, prefixes: PrefixIndex) -> None:
        """The scheduler's prefix index, for rules that place by cached prefix (others ignore it)."""
        return None

    def choose(self, fits: Sequence[WorkerSlot], request: Request | None) -> WorkerSlot:
        raise NotImplementedError
