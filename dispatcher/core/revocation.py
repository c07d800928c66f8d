"""Revocation by over-service: requests handed to an engine that has not started them, taken back for a
tenant that waits while no capacity is free. A part of ``FairScheduler`` (docs/architecture.md,
"Revocation").

Once the engines' queues are full, a request the dispatcher holds waits for every request queued ahead
of it inside an engine, whoever sent them: fair order ends at the engine's door. With ``revoke`` set,
a dispatch charge is *held* until its request starts, and a tenant that comes back is lifted to what
the least served has begun to get (counter less held: ``VirtualTokenCounter.rejoin``). When the policy's next
tenant cannot be placed, the dispatcher takes back, on one worker, the unstarted requests VTC would
have served after it (by the tree's counters, compared where the two tenants' paths part), so the
waiting request goes in ahead of them and they follow it in the policy's order. The worker answers
each with a finish whose reason is ``revoked`` only if its engine had not started it (then it never
will there); that finish puts it back at the head of its tenant's queue with its dispatch charge
refunded (``requeue``). One round is out at a time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from dispatcher.core.model import Request, Tenant
from dispatcher.core.tree import SPARE, STRICT, TreeNode

BAND_ORDER = {STRICT: 0, SPARE: 2}  # served in this order; every other top-level member: the fair tree (1)


class Revocation:
    """Choosing what to take back, and settling what was taken back, for a ``FairScheduler``."""

    def revocations(self) -> list[tuple[str, str]]:
        """(request id, worker id) to take back now; called after ``assign``, so a tenant still waiting
        has nothing to place its next request on. None unless ``revoke`` is set, none while a round is
        out. Of each other tenant, its unstarted requests are taken newest first while, with them
        refunded, its side stays strictly ahead of the waiting one's: VTC would have served the waiting
        request before them, and does once they are back (and it, dispatched, is then ahead of them: no
        request is ever taken back for one that was taken back for it). Only on one worker: the one
        where the fewest unstarted requests would stay ahead of the waiting request, then the one where
        the fewest are taken."""
        if not self.config.revoke or self.revoking or not self.state.in_flight:
            return []
        chosen = self._for_the_stalled() or self._for_the_queued()
        for rid, wid in chosen:
            self.revoking[rid] = wid
        return chosen

    def _for_the_stalled(self) -> list[tuple[str, str]]:
        """For the policy's next tenant, waiting in the dispatcher with nowhere to go."""
        top = self.tree.pick()
        if top is None or top[2] is self.tree.spare:
            return []
        _, waiting, _ = top
        head = self.policy.next_request(waiting)
        if head.urgent:  # it has its own path past the engines' queues
            return []
        unstarted: dict[str, list[Request]] = {}
        for req in self.state.in_flight.values():
            if not req.started and req.worker is not None:
                unstarted.setdefault(req.tenant, []).append(req)
        taken: set[str] = set()
        for name, reqs in unstarted.items():
            taken.update(self._taken_from(self.tenants[name], reqs, waiting))
        per_worker: dict[str, list[str]] = {}
        staying: dict[str, int] = {}
        for reqs in unstarted.values():
            for req in reqs:
                slot = self.workers.get(req.worker or "")
                if slot is None or slot.draining or slot.kv_tokens < head.need:
                    continue
                if req.id in taken:
                    per_worker.setdefault(slot.id, []).append(req.id)
                else:
                    staying[slot.id] = staying.get(slot.id, 0) + 1
        if not per_worker:
            return []
        worker = min(per_worker, key=lambda w: (staying.get(w, 0), len(per_worker[w]), w))
        return [(rid, worker) for rid in per_worker[worker]]

    def _for_the_queued(self) -> list[tuple[str, str]]:
        """For a request already in an engine's queue behind others' unstarted requests (an engine
        takes its queue in the order it was given it): those of them VTC would have served after it,
        on the first worker where there are any, for the first such request in its queue."""
        queues: dict[str, list[Request]] = {}
        unstarted: dict[str, list[Request]] = {}
        for req in self.state.in_flight.values():
            if not req.started and req.worker is not None:
                queues.setdefault(req.worker, []).append(req)
                unstarted.setdefault(req.tenant, []).append(req)
        for worker in sorted(queues):
            order = sorted(queues[worker], key=lambda r: r.handed)
            for i, behind in enumerate(order[1:], start=1):
                waiting = self.tenants.get(behind.tenant)
                if waiting is None or behind.urgent:
                    continue
                ahead = {r.id for r in order[:i]}
                taken = [
                    rid
                    for name in dict.fromkeys(r.tenant for r in order[:i])
                    for rid in self._taken_from(self.tenants[name], unstarted[name], waiting, behind, ahead)
                ]
                if taken:
                    return [(rid, worker) for rid in taken]
        return []

    def over_service(self, served: Tenant, waiting: Tenant) -> float:
        """How far ``served`` is ahead of ``waiting`` in the tree's counters, compared between the two
        members where their paths from the root part (siblings: the bound VTC keeps is between them).
        Infinite when ``served`` sits in a band served after ``waiting``'s; minus infinite when before."""
        a, b = _path(served), _path(waiting)
        band_a, band_b = _band(a[0]), _band(b[0])
        if band_a != band_b:
            return math.inf if band_a > band_b else -math.inf
        x, y = _parting(served, waiting)
        return x.counter - y.counter

    def _taken_from(
        self,
        served: Tenant,
        reqs: list[Request],
        waiting: Tenant,
        behind: Request | None = None,
        among: set[str] | None = None,
    ) -> list[str]:
        """Which of ``served``'s unstarted ``reqs`` (all of them) to take back for ``waiting``: newest
        dispatched first, while its side, with them and every one dispatched after them refunded, stays
        strictly ahead of the waiting side. ``behind``: the waiting tenant's request already in an
        engine's queue behind them (the waiting side is compared without it), and ``among``: those ahead
        of it there, the only ones that may be taken."""
        if served is waiting:
            return []
        gap = self.over_service(served, waiting)
        newest_first = sorted(reqs, key=lambda r: -r.handed)
        if gap == math.inf:
            return [r.id for r in newest_first if not r.urgent and (among is None or r.id in among)]
        a, b = _parting(served, waiting)
        room = gap + (behind.held / b.weight if behind is not None else 0.0)
        out: list[str] = []
        for req in newest_first:
            room -= req.held / a.weight
            if room <= 0:
                break
            if not req.urgent and (among is None or req.id in among):
                out.append(req.id)
        return out

    def settle_revoked(self, request_id: str) -> bool:
        """Its worker took ``request_id`` back before its engine started it: it waits again at the head of
        its tenant's queue, its dispatch charge refunded (one asked for before a restart too: the worker
        never runs it). False when it is not in flight here or has started (a stray answer: it runs,
        nothing changes)."""
        req = self.state.in_flight.get(request_id)
        if req is None or req.started:
            self.revocation_answered(request_id)
            return False
        self.revoking[request_id] = req.worker or ""  # a revocation, whoever asked for it: counted
        slot = self.workers.get(req.worker or "")
        if slot is not None and slot.waiting > 0:  # its engine holds one fewer (an idle one reports no more)
            slot.waiting -= 1
        return self.requeue(request_id)

    def revocation_answered(self, request_id: str) -> None:
        """``request_id`` started or ended otherwise: it is no longer out to be taken back."""
        if self.revoking:
            self.revoking.pop(request_id, None)

    def _hold(self, t: Tenant, req: Request, counter_before: float) -> None:
        """What ``req``'s dispatch charged ``t`` is held apart until it starts: a tenant that comes back
        is lifted to the service the least served one has begun to get, not to what engines hold for it."""
        req.held = (t.counter - counter_before) * t.weight
        _move_held(req, self.tenants, self.tree.nodes, 1.0)

    def _unhold(self, req: Request) -> None:
        """``req`` started, went back to its queue or ended: it is no longer held (nor out to be taken back)."""
        self.revocation_answered(req.id)
        if req.held:
            _move_held(req, self.tenants, self.tree.nodes, -1.0)
            req.held = 0.0


def _move_held(req: Request, tenants: Mapping[str, Tenant], nodes: Mapping[str, TreeNode], sign: float) -> None:
    """Add (``sign`` 1) or take away (-1) ``req``'s held charge at its tenant and the nodes it was
    charged to, at the weights it was charged at."""
    t = tenants.get(req.tenant)
    if t is not None:
        t.unstarted = max(0.0, t.unstarted + sign * req.held / req.weight)
    for name, weight in req.path:
        node = nodes.get(name)
        if node is not None:
            node.unstarted = max(0.0, node.unstarted + sign * req.held / weight)


def _path(t: Tenant) -> list[Tenant | TreeNode]:
    """``t``'s members from the top of its band down to it."""
    return [*reversed(t.ancestors), t]


def _band(top: Tenant | TreeNode) -> int:
    return BAND_ORDER.get(top.parent, 1)


def _parting(a: Tenant, b: Tenant) -> tuple[Tenant | TreeNode, Tenant | TreeNode]:
    """The members of ``a``'s and ``b``'s paths where they part (the leaves themselves at worst)."""
    for x, y in zip(_path(a), _path(b), strict=False):
        if x is not y:
            return x, y
    return a, b
