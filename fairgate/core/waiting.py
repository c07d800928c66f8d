"""The set of waiting tenants, ordered by the policy's key: O(log n) to pick the one served next.

A binary heap (``heapq``, C code) with two kinds of laziness:

- a tenant's entry may hold a key *lower* than its current one. Keys mostly grow (each decoded token
  adds to a counter; a served head request makes way for a later one), so ``peek`` re-keys an entry
  when it reaches the top instead of the scheduler pushing on every charge. Anything that lowers a
  key (a refund, a request put back at the head of its queue) must ``push``.
- removing a tenant only forgets its live entry; dead entries are dropped when they reach the top,
  and the heap is rebuilt when they outnumber live ones.

Entries are (key, tie, tenant); ties keep the order in which tenants joined, so equal keys are served
in a deterministic order that a snapshot can reproduce.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator


class WaitingSet:
    __slots__ = ("_heap", "_key_of", "_live", "_tie")

    def __init__(self, key_of: Callable[[str], float]) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._live: dict[str, int] = {}  # tenant -> tie of its live entry
        self._tie = 0
        self._key_of = key_of

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, tenant: str) -> bool:
        return tenant in self._live

    def __iter__(self) -> Iterator[str]:
        return iter(self._live)

    def push(self, tenant: str, key: float) -> None:
        """Insert ``tenant``, or record that its key went down."""
        self._tie += 1
        self._live[tenant] = self._tie
        heapq.heappush(self._heap, (key, self._tie, tenant))
        if len(self._heap) > 2 * len(self._live) + 64:
            self._compact()

    def remove(self, tenant: str) -> None:
        self._live.pop(tenant, None)

    def peek(self) -> tuple[float, str] | None:
        """The (key, tenant) with the smallest current key, or None when empty."""
        heap, live, key_of = self._heap, self._live, self._key_of
        while heap:
            key, tie, tenant = heap[0]
            if live.get(tenant) != tie:
                heapq.heappop(heap)
                continue
            current = key_of(tenant)
            if current == key:
                return key, tenant
            heapq.heapreplace(heap, (current, tie, tenant))
        return None

    def replace_top(self, tenant: str, key: float) -> None:
        """Move the tenant just returned by ``peek`` to ``key`` (one heap operation, no dead entry)."""
        heapq.heapreplace(self._heap, (key, self._live[tenant], tenant))

    def pop_top(self, tenant: str) -> None:
        """Remove the tenant just returned by ``peek``."""
        del self._live[tenant]
        heapq.heappop(self._heap)

    def smallest(self, limit: int) -> list[str]:
        """Up to ``limit`` tenants in key order (for the relaxed head-of-line rule): O(limit log n)."""
        taken: list[tuple[float, int, str]] = []
        while len(taken) < limit and self.peek() is not None:
            taken.append(heapq.heappop(self._heap))
        for entry in taken:
            heapq.heappush(self._heap, entry)
        return [tenant for _, _, tenant in taken]

    def entries(self) -> list[tuple[str, int]]:
        """(tenant, tie) of live entries, for snapshots."""
        return list(self._live.items())

    def load(self, entries: Iterable[tuple[str, int]], next_tie: int) -> None:
        """Rebuild from (tenant, tie) pairs with current keys, keeping their order exactly."""
        pairs = list(entries)
        self._live = dict(pairs)
        self._heap = [(self._key_of(tenant), tie, tenant) for tenant, tie in pairs]
        heapq.heapify(self._heap)
        self._tie = next_tie

    @property
    def key_of(self) -> Callable[[str], float]:
        return self._key_of

    @key_of.setter
    def key_of(self, key_of: Callable[[str], float]) -> None:
        """Change how entries are keyed (a tree node whose children became a mix of nodes and tenants)."""
        self._key_of = key_of

    @property
    def next_tie(self) -> int:
        return self._tie

    def _compact(self) -> None:
        live = self._live
        self._heap = [e for e in self._heap if live.get(e[2]) == e[1]]
        heapq.heapify(self._heap)
