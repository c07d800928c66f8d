"""The set of waiting tenants, ordered by a key: O(log n) to pick the least-served one.

A binary heap with lazy invalidation (``heapq`` is C code, several times faster than a Python
indexed heap): changing a tenant's key pushes a fresh entry and marks the old one stale; stale
entries are dropped when they reach the top, and the heap is rebuilt when they outnumber live ones.
Equal keys are served in the order their entries were pushed.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable


class WaitingSet:
    __slots__ = ("_heap", "_live", "_tie")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._live: dict[str, int] = {}  # tenant -> tie of its live entry
        self._tie = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, tenant: str) -> bool:
        return tenant in self._live

    def __iter__(self):
        return iter(self._live)

    def push(self, tenant: str, key: float) -> None:
        """Insert ``tenant`` or move it to ``key``."""
        self._tie += 1
        self._live[tenant] = self._tie
        heapq.heappush(self._heap, (key, self._tie, tenant))
        if len(self._heap) > 2 * len(self._live) + 64:
            self._compact()

    def remove(self, tenant: str) -> None:
        self._live.pop(tenant, None)

    def peek(self) -> tuple[float, str] | None:
        """The (key, tenant) with the smallest key, or None when empty."""
        heap, live = self._heap, self._live
        while heap:
            key, tie, tenant = heap[0]
            if live.get(tenant) == tie:
                return key, tenant
            heapq.heappop(heap)
        return None

    def replace_top(self, tenant: str, key: float) -> None:
        """Move the tenant just returned by ``peek`` to ``key`` (one heap operation, no stale entry)."""
        self._tie += 1
        self._live[tenant] = self._tie
        heapq.heapreplace(self._heap, (key, self._tie, tenant))

    def pop_top(self, tenant: str) -> None:
        """Remove the tenant just returned by ``peek``."""
        del self._live[tenant]
        heapq.heappop(self._heap)

    def smallest(self, limit: int) -> list[str]:
        """Up to ``limit`` tenants in key order (for the relaxed head-of-line rule): O(limit log n)."""
        heap, live = self._heap, self._live
        taken: list[tuple[float, int, str]] = []
        while heap and len(taken) < limit:
            entry = heapq.heappop(heap)
            if live.get(entry[2]) == entry[1]:
                taken.append(entry)
        for entry in taken:
            heapq.heappush(heap, entry)
        return [tenant for _, _, tenant in taken]

    def entries(self) -> list[tuple[str, int]]:
        """(tenant, tie) of live entries, for snapshots."""
        return list(self._live.items())

    def load(self, entries: Iterable[tuple[str, float, int]], next_tie: int) -> None:
        """Rebuild from (tenant, key, tie) triples, keeping their order exactly."""
        self._live = {tenant: tie for tenant, _, tie in entries}
        self._heap = [(key, tie, tenant) for tenant, key, tie in entries]
        heapq.heapify(self._heap)
        self._tie = next_tie

    @property
    def next_tie(self) -> int:
        return self._tie

    def _compact(self) -> None:
        live = self._live
        self._heap = [e for e in self._heap if live.get(e[2]) == e[1]]
        heapq.heapify(self._heap)
