"""Which waiting requests continue a prompt just dispatched, and where: the locality slack's long view.

A conversation's next turn repeats the whole previous prompt, so its best worker is the one the
previous turn went to, while that worker's cache (its pool, or a tier below it) still holds it. Under
overload a tenant's queue holds many turns, and its later turns wait far behind its head: a window over
the queue's first requests never sees them, and by the time they reach the head the cache has moved
on. So when a request is dispatched, the waiting requests whose prompt contains its last block (they
extend it) are homed on its worker; the locality slack then looks at each worker's homed requests
beside the first few of each queue (``OutOfOrderPicks._local_pick``), and the prefix index says how
much of the prefix is still there.

A request's home is a field of it (``Request.home``, and when it was homed: ``home_seq``); a snapshot
keeps each worker's homed requests in their order (the most recently homed is looked at first), and
the registry by block is rebuilt from the queues (its order never matters: extensions are taken by
their submission order).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from fairgate.core.model import Request


class Continuations:
    """Waiting requests by the blocks of their prompts, and by the worker they are homed on."""

    __slots__ = ("_by_block", "homes", "next_homing")

    def __init__(self) -> None:
        self._by_block: dict[int, dict[str, Request]] = {}
        self.homes: dict[str, dict[str, Request]] = {}  # worker -> homed waiting requests, oldest homing first
        self.next_homing = 1  # the next homing's number

    def wait(self, req: Request) -> None:
        """``req`` waits in its queue."""
        by_block = self._by_block
        for h in req.prefix:
            waiting = by_block.get(h)
            if waiting is None:
                by_block[h] = {req.id: req}
            else:
                waiting[req.id] = req
        if req.home:
            if not req.home_seq:
                req.home_seq, self.next_homing = self.next_homing, self.next_homing + 1
            self.homes.setdefault(req.home, {})[req.id] = req

    def leave(self, req: Request) -> None:
        """``req`` left its queue (dispatched, withdrawn or dropped)."""
        by_block = self._by_block
        for h in req.prefix:
            waiting = by_block.get(h)
            if waiting is not None and waiting.get(req.id) is req:
                del waiting[req.id]
                if not waiting:
                    del by_block[h]
        self._unhome(req)

    def dispatched(self, req: Request, worker_id: str) -> None:
        """``req`` (which has left its queue) went to ``worker_id``: the waiting requests that extend its
        prompt are homed there."""
        if not req.prefix:
            return
        extending = self._by_block.get(req.prefix[-1])
        if not extending:
            return
        homed = self.homes.setdefault(worker_id, {})
        for other in sorted(extending.values(), key=lambda r: r.seq):
            if other.home != worker_id:
                self._unhome(other)
                other.home = worker_id
            homed.pop(other.id, None)
            homed[other.id] = other  # the newest homing last
            other.home_seq, self.next_homing = self.next_homing, self.next_homing + 1

    def homed(self, worker_id: str) -> Iterator[Request]:
        """The requests homed on ``worker_id``, most recently homed first (their prefix is freshest)."""
        homed = self.homes.get(worker_id)
        return reversed(homed.values()) if homed else iter(())

    def snapshot(self) -> dict[str, Any]:
        return {"homes": {worker: list(homed) for worker, homed in self.homes.items()}, "next_homing": self.next_homing}

    def restore(self, data: Mapping[str, Any], waiting: Iterable[Request]) -> None:
        """From ``snapshot`` and the requests waiting in the queues restored beside it."""
        by_id = {req.id: req for req in waiting}
        self._by_block, self.homes = {}, {}
        for req in by_id.values():
            for h in req.prefix:
                self._by_block.setdefault(h, {})[req.id] = req
        self.homes = {worker: {rid: by_id[rid] for rid in ids} for worker, ids in data["homes"].items()}
        self.next_homing = int(data["next_homing"])

    def _unhome(self, req: Request) -> None:
        if not req.home:
            return
        homed = self.homes.get(req.home)
        if homed is not None and homed.get(req.id) is req:
            del homed[req.id]
            if not homed:
                del self.homes[req.home]
