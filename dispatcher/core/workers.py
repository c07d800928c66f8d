"""The dispatcher's view of worker capacity, and where a request that fits should go.

Admission is pull-shaped (DESIGN §2): a request is assigned to a worker only when that worker can start
it now. Each worker reports its free KV tokens and counts once per engine step; between reports the
table adds what it has assigned but not yet seen started (``pending``), so it never over-commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dispatcher.core.model import Request


@dataclass(slots=True)
class WorkerSlot:
    """One worker replica as the dispatcher sees it.

    ``committed``: KV tokens promised to requests on this worker (prompt + output reserve), until they
    finish. ``pending_*``: assigned but not yet reported started, so not yet in ``free_tokens``.
    """

    id: str
    kv_tokens: int
    max_running: int | None = None
    free_tokens: int = 0
    running: int = 0
    waiting: int = 0
    committed: int = 0
    pending_count: int = 0
    pending_tokens: int = 0
    in_flight: int = 0
    draining: bool = False
    prompt_tokens: int = 0  # of the requests that started here, and of those found in its prefix cache
    cached_tokens: int = 0

    def room(self) -> int:
        """KV tokens a new request may use here now."""
        return min(self.kv_tokens - self.committed, self.free_tokens - self.pending_tokens)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class Placement(Protocol):
    """Picks one worker among those a request fits on (``dispatcher.core.placement`` holds the rules)."""

    def choose(self, fits: Sequence[WorkerSlot], request: Request | None) -> WorkerSlot: ...


class WorkerTable:
    """All workers; answers "where can this request start now?"."""

    def __init__(self, placement: Placement, max_engine_waiting: int = 8) -> None:
        self.max_engine_waiting = max_engine_waiting
        self.placement = placement
        self.slots: dict[str, WorkerSlot] = {}
        self._active: list[WorkerSlot] = []  # not draining; kept current by refresh()
        self.largest_pool = 0  # the largest KV pool among workers taking work (0 when there are none)

    def refresh(self) -> None:
        """Recompute the cached list of workers taking work (after join, drain or leave)."""
        self._active = [w for w in self.slots.values() if not w.draining]
        self.largest_pool = max((w.kv_tokens for w in self._active), default=0)

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, worker_id: str) -> WorkerSlot:
        return self.slots[worker_id]

    def get(self, worker_id: str) -> WorkerSlot | None:
        return self.slots.get(worker_id)

    def join(self, worker_id: str, kv_tokens: int, max_running: int | None, free_tokens: int | None) -> None:
        if kv_tokens <= 0:
            raise ValueError(f"worker {worker_id!r}: KV pool must be positive, got {kv_tokens}")
        slot = self.slots.get(worker_id)
        if slot is None:
            free = kv_tokens if free_tokens is None else free_tokens
            self.slots[worker_id] = WorkerSlot(worker_id, kv_tokens, max_running, free_tokens=free)
        else:  # a re-announcing worker keeps what is committed to it
            slot.kv_tokens, slot.max_running, slot.draining = kv_tokens, max_running, False
            if free_tokens is not None:
                slot.free_tokens = free_tokens
        self.refresh()

    def drain(self, worker_id: str) -> None:
        slot = self.slots.get(worker_id)
        if slot is not None:
            slot.draining = True
            self.refresh()

    def leave(self, worker_id: str) -> WorkerSlot | None:
        slot = self.slots.pop(worker_id, None)
        self.refresh()
        return slot

    def has_slack(self) -> bool:
        """Whether some worker could take one more request by count (KV room is checked in place)."""
        limit = self.max_engine_waiting
        for w in self._active:
            if w.pending_count + w.waiting < limit and (
                w.max_running is None or w.running + w.pending_count < w.max_running
            ):
                return True
        return False

    def place(self, need: int, request: Request | None = None) -> WorkerSlot | None:
        """The worker that should start a request needing ``need`` KV tokens now, or None."""
        limit = self.max_engine_waiting
        fits: list[WorkerSlot] = []
        for w in self._active:
            if (
                w.pending_count + w.waiting < limit
                and min(w.kv_tokens - w.committed, w.free_tokens - w.pending_tokens) >= need
                and (w.max_running is None or w.running + w.pending_count < w.max_running)
            ):
                fits.append(w)
        if not fits:
            return None
        return fits[0] if len(fits) == 1 else self.placement.choose(fits, request)

    def snapshot(self) -> list[dict[str, Any]]:
        return [w.to_dict() for w in self.slots.values()]

    def restore(self, rows: Iterable[dict[str, Any]]) -> None:
        self.slots = {row["id"]: WorkerSlot(**row) for row in rows}
        self.refresh()
