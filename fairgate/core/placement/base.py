"""The interface of a placement rule, and the registry of rules by name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from fairgate.core.model import Request
from fairgate.core.prefix_index import PrefixIndex
from fairgate.core.registry import Param, Registry, spec_text
from fairgate.core.workers import WorkerSlot

PLACEMENTS: Registry[type[PlacementRule]] = Registry("placement rule")
BALANCE = 0.25  # the rules that prefer some workers pass over one this much fuller (of its pool) than the emptiest
BALANCE_DOC = "a worker this much fuller (share of its pool) than the emptiest is passed over"
register = PLACEMENTS.register


def fullness(w: WorkerSlot) -> float:
    """The share of its pool a worker has no room in (used, kept by its watermark, or assigned)."""
    return 1.0 - w.room() / w.kv_tokens


def most_room(w: WorkerSlot) -> tuple[int, int, int, str]:
    """The order of ``most-room``: the least prompt work already assigned for the engine's next step
    (a request placed there waits for that prefill too, so a burst is spread rather than sent whole to
    the emptiest engine as one long prefill), then the most room, the fewest running, the id."""
    return (w.pending_tokens, -w.room(), w.running + w.pending_count, w.id)


class PlacementRule:
    """Choose one worker among ``fits`` (never empty; every one of them can start the request now).
    ``request`` is None when the scheduler only asks whether a request of some size would fit."""

    name: ClassVar[str]
    params: ClassVar[tuple[Param, ...]] = ()  # each an attribute of the same name (``spec`` writes them)
    candidates: ClassVar[int | None] = None  # how many workers that fit it needs to see (None: all)

    @property
    def spec(self) -> str:
        """The text that builds this rule again (``make_placement(rule.spec)``)."""
        return spec_text(type(self), {p.name: getattr(self, p.name) for p in self.params})

    def attach(self, prefixes: PrefixIndex) -> None:
        """The scheduler's prefix index, for rules that place by cached prefix (others ignore it)."""
        return None

    def choose(self, fits: Sequence[WorkerSlot], request: Request | None) -> WorkerSlot:
        raise NotImplementedError
