"""The requests waiting in the dispatcher: each tenant's queue (kept on its record), the index of what
waits where, the arrival order that ``max_queue_s`` expires by, the continuations the locality slack
looks at, and the requests dropped from the queues that the caller has not collected yet."""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

from fairgate.core.continuations import Continuations
from fairgate.core.model import Request, Tenant, request_from_dict
from fairgate.core.tenant_book import TenantBook


class WaitingQueues:
    """Where each waiting request is, in the policy's waiting sets (through the book's tree) and here."""

    __slots__ = ("_arrivals", "_book", "_dropped", "_ids", "_slack", "continuations", "expiring")

    def __init__(self, book: TenantBook, locality: bool, expiring: bool) -> None:
        self._book = book
        self._slack = locality  # the policy looks past its order for cached prefixes: continuations kept
        self.expiring = expiring  # requests are withdrawn after ``max_queue_s``: arrivals kept
        self._ids: dict[str, str] = {}  # queued request id -> its leaf
        self._arrivals: list[tuple[float, int, str]] = []  # heap (arrival, seq, id)
        self.continuations = Continuations()
        self._dropped: list[tuple[Request, str]] = []

    # ------------------------------------------------------------------ views

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._ids

    def leaf_of(self, request_id: str) -> str | None:
        return self._ids.get(request_id)

    # ------------------------------------------------------------------ joining

    def enqueue(self, t: Tenant, req: Request, lift: bool) -> None:
        """``req`` waits at the end of ``t``'s queue; ``t`` joins its waiting set if it was idle
        (``lift``: by the policy's rule, unless it never stopped waiting)."""
        if not t.queue:
            t.queue.append(req)
            self._book.tree.join(t, lift)
        else:
            t.queue.append(req)
        t.queued_tokens += req.prompt_tokens + req.max_tokens
        self._ids[req.id] = t.name
        if req.prefix and self._slack:
            self.continuations.wait(req)
        if self.expiring:
            heapq.heappush(self._arrivals, (req.arrival, req.seq, req.id))

    def put_back(self, t: Tenant, req: Request, before: float | None) -> None:
        """``req``, assigned and never started, waits again at the head of ``t``'s queue, ahead of
        everything sent later, as it did before; ``before``: ``t``'s key before its charge was refunded
        (None: its queue was empty). Its ``max_queue_s`` still counts from its arrival."""
        t.queue.appendleft(req)
        if req.prefix and self._slack:
            self.continuations.wait(req)
        if before is None:
            self._book.tree.join(t, lift=False)
            self._book.tree.rekey_ancestors(t)  # the refund lowered the counters above it
        else:
            self._book.rekey_if_lower(t, before)
        t.queued_tokens += req.prompt_tokens + req.max_tokens
        self._ids[req.id] = t.name
        if self.expiring:
            heapq.heappush(self._arrivals, (req.arrival, req.seq, req.id))

    # ------------------------------------------------------------------ leaving

    def unqueue(self, t: Tenant, req: Request) -> None:
        """Remove a waiting request from its tenant's queue (the waiting set is the caller's)."""
        if t.queue[0] is req:
            t.queue.popleft()
        else:
            t.queue.remove(req)
        t.queued_tokens -= req.prompt_tokens + req.max_tokens
        self._ids.pop(req.id, None)
        if req.prefix and self._slack:
            self.continuations.leave(req)

    def take(self, t: Tenant, req: Request) -> None:
        """Remove a waiting request (withdrawn, dropped, or dispatched out of the policy's order). Its
        tenant's key may go down: a key read from the head (FCFS's arrival order) falls when the head
        leaves and a request put back ahead of earlier ones had been the head."""
        book = self._book
        before = book.key(t.name) if len(t.queue) > 1 else None  # its last request: it leaves anyway
        self.unqueue(t, req)
        if not t.queue:
            book.tree.leave(t, at_top=False)
        else:
            book.rekey_if_lower(t, before)

    def withdraw(self, request_id: str, seq: int | None = None) -> bool:
        """Remove a waiting request by id (and, when given, only the submission numbered ``seq``)."""
        return self.withdrawn(request_id, seq) is not None

    def withdrawn(self, request_id: str, seq: int | None = None) -> Request | None:
        """``withdraw``, returning the request removed (None: no such waiting request)."""
        leaf = self._ids.get(request_id)
        if leaf is None:
            return None
        t = self._book.tenants[leaf]
        for req in t.queue:
            if req.id == request_id and (seq is None or req.seq == seq):
                self.take(t, req)
                return req
        return None

    def expire(self, now: float, limit: float) -> list[str]:
        """Withdraw the requests that have waited longer than ``limit`` since they arrived (one put back
        in its queue after a failed placement included); returns their ids."""
        expired: list[str] = []
        arrivals = self._arrivals
        while arrivals and arrivals[0][0] <= now - limit:
            _, seq, request_id = heapq.heappop(arrivals)
            if self.withdraw(request_id, seq):  # the same submission, not a later one with its id
                expired.append(request_id)
        return expired

    def move(self, t: Tenant, req: Request, to: Tenant) -> None:
        """Move a waiting request to another leaf's queue (demoted to the spare band: it joins there
        lifted, as anyone joining late)."""
        self.take(t, req)
        req.tenant = to.name
        joins = not to.queue
        to.queue.append(req)
        if joins:
            self._book.tree.join(to, True)
        to.queued_tokens += req.prompt_tokens + req.max_tokens
        self._ids[req.id] = to.name

    def drop(self, t: Tenant, req: Request, reason: str) -> None:
        """Remove a request that can never run (or no longer fits a quota): the caller learns why."""
        self.take(t, req)
        t.rejected += 1
        self._dropped.append((req, reason))

    def take_dropped(self) -> list[tuple[Request, str]]:
        dropped, self._dropped = self._dropped, []
        return dropped

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, Any]:
        return {
            "ids": list(self._ids.items()),
            "arrivals": [list(entry) for entry in self._arrivals],
            "continuations": self.continuations.snapshot(),
            "dropped": [[req.to_dict(), reason] for req, reason in self._dropped],
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        """After the book's restore (the queues it holds are the ones indexed here)."""
        self._ids = {str(rid): str(leaf) for rid, leaf in data["ids"]}
        self._arrivals = [(float(at), int(seq), str(rid)) for at, seq, rid in data["arrivals"]]
        waiting = [req for t in self._book.tenants.values() for req in t.queue if req.prefix] if self._slack else []
        self.continuations.restore(data["continuations"], waiting)
        self._dropped = [(request_from_dict(row), str(reason)) for row, reason in data["dropped"]]
