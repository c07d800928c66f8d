"""The scheduler's own record: everything it knows of tenants and requests beyond its settings and the
tables of its parts (tree, workers, policy, prefix index, predictor). Snapshots and durable state are
written from this record and read back into it through its own functions, so recovery never reaches
into the scheduler's private fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fairgate.core.model import Request, Tenant

# what a request that ran was charged, kept for its re-announcement: prompt, output, charged output,
# the weight and tree path its charges were divided by
Settled = tuple[int, int, int, float, tuple[tuple[str, float], ...]]


@dataclass
class SchedulerState:
    """Tenants, the requests queued and in flight, and what is kept across a worker's or the
    dispatcher's departure."""

    tenants: dict[str, Tenant] = field(default_factory=dict)
    in_flight: dict[str, Request] = field(default_factory=dict)
    queued_ids: dict[str, str] = field(default_factory=dict)  # queued request id -> its tenant
    arrivals: list[tuple[float, int, str]] = field(default_factory=list)  # heap (arrival, seq, id): max_queue_s
    next_seq: int = 0
    # id -> what a request that ran when its worker or this dispatcher went away was charged: what its
    # re-announcement is charged beyond
    settled: dict[str, Settled] = field(default_factory=dict)
    settled_before: set[str] = field(default_factory=set)  # settled ids already there at the last sweep
    resumed: set[str] = field(default_factory=set)  # tenants waiting when the durable state was written
    # [saved, restored): when the durable state this scheduler continues from was written, and when it
    # was restored; what the dispatcher before assigned in between, no saved counter holds
    unsaved: tuple[float, float] | None = None
    recovered: set[str] = field(default_factory=set)  # ids from that window settled here (never twice)
    unstarted_at_save: set[str] = field(default_factory=set)  # assigned, not started: saved as refunded
    longest_prompt: int = 0  # of every request submitted, and the largest max_tokens: for 2U
    longest_output: int = 0

    def is_empty(self) -> bool:
        """Nothing queued or in flight: a durable state may be restored into it."""
        return not self.in_flight and not self.queued_ids

    def index_queues(self) -> None:
        """Rebuild the index of queued ids from the tenants' queues."""
        self.queued_ids = {r.id: t.name for t in self.tenants.values() for r in t.queue}

    def index_arrivals(self) -> None:
        """Rebuild the arrival heap from the tenants' queues (a sorted list is a heap)."""
        self.arrivals = sorted((r.arrival, r.seq, r.id) for t in self.tenants.values() for r in t.queue)

    def settled_rows(self) -> list[list[Any]]:
        """The settled requests as JSON-able rows: [id, prompt, output, charged output, weight, path]."""
        return [[rid, p, o, c, w, [list(step) for step in path]] for rid, (p, o, c, w, path) in self.settled.items()]

    def restore_settled(self, rows: list[list[Any]]) -> None:
        """From ``settled_rows`` (older states have no weight: 1; no path: none)."""
        self.settled = {
            row[0]: (
                int(row[1]),
                int(row[2]),
                int(row[3]),
                float(row[4]) if len(row) > 4 else 1.0,
                tuple((str(name), float(w)) for name, w in row[5]) if len(row) > 5 else (),
            )
            for row in rows
        }

    def longest(self) -> list[int]:
        return [self.longest_prompt, self.longest_output]

    def restore_longest(self, pair: Any) -> None:
        self.longest_prompt, self.longest_output = (int(v) for v in pair)
