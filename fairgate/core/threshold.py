"""The threshold rule: a service gap between backlogged tenants that does not grow with the fleet.

VTC's bound is 2U, and U grows with what the engines hold at once: a tenant handed many slots while it
was behind goes on being served by all of them once it has caught up, and the more engines, the more
slots (the VTC paper names this: its bound depends on the engines' aggregate memory). The paper's cure,
built here: when the counter of a tenant with requests running passes the least-served waiting
tenant's by more than ``threshold`` (cost units at weight 1), the rule takes back that tenant's
running requests beyond its weighted share of what the two run (started in their engines), newest
first. Their engines stop them; each goes back to its tenant's queue as a continuation: its prompt and
the output so far, to be prefilled again (the recomputed tokens are the rule's cost, charged to the
tenant that was ahead).

It compares leaves' counters, so it applies to a flat set of tenants under a policy that orders by
counters; one round is out at a time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fairgate.core.in_flight import InFlight
from fairgate.core.model import Request
from fairgate.core.tenant_book import TenantBook


class ThresholdRule:
    """Choosing the running requests to take back, and those asked for and not answered yet."""

    __slots__ = ("_book", "_in_flight", "taken", "taking", "threshold")

    def __init__(self, threshold: float | None, book: TenantBook, in_flight: InFlight) -> None:
        self.threshold = threshold if threshold is not None and book.policy.tree else None
        self._book = book
        self._in_flight = in_flight
        self.taking: dict[str, str] = {}  # request id -> worker: asked to stop it, no answer yet
        self.taken = 0  # requests taken back in all

    def preemptions(self) -> list[tuple[str, str]]:
        """(request id, worker id) of running requests to take back now (called after ``assign``: the
        least-served waiting tenant has nowhere to go)."""
        threshold, book = self.threshold, self._book
        if threshold is None or self.taking or book.tree.nodes:
            return []
        waiting = [t for t in book.tenants.values() if t.queue]
        if not waiting:
            return []
        low = min(waiting, key=lambda t: t.counter)
        ahead = {t.name: t for t in book.tenants.values() if t.in_flight and t.counter - low.counter > threshold}
        if not ahead:
            return []
        running: dict[str, list[Request]] = {name: [] for name in ahead}
        low_running = 0
        for r in self._in_flight:
            if not r.started:
                continue
            if r.tenant == low.name:
                low_running += 1
            elif r.tenant in running:
                running[r.tenant].append(r)
        chosen: list[tuple[str, str]] = []
        for name, mine in running.items():
            t = ahead[name]
            share = (len(mine) + low_running) * t.weight / (t.weight + low.weight)
            # the further past the threshold, the less of its share it keeps: as many requests need not
            # be served as fast (longer prompts, more output at once)
            keep = math.ceil(share * threshold / (t.counter - low.counter))
            mine.sort(key=lambda r: r.handed, reverse=True)  # the newest first: the least done, recomputed
            chosen += [(r.id, r.worker) for r in mine[: max(0, len(mine) - keep)] if r.worker is not None]
        self.taking.update(chosen)
        self.taken += len(chosen)
        return chosen

    def answered(self, request_id: str) -> None:
        """Its worker stopped it (or it had ended): the next round may go out."""
        self.taking.pop(request_id, None)

    def snapshot(self) -> dict[str, Any]:
        return {"taking": dict(self.taking), "taken": self.taken}

    def restore(self, data: Mapping[str, Any]) -> None:
        self.taking = {str(rid): str(worker) for rid, worker in data["taking"].items()}
        self.taken = int(data["taken"])
