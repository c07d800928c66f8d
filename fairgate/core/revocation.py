"""Revocation by over-service: requests handed to an engine that has not started them, taken back for a
tenant that waits while no capacity is free (docs/architecture.md, "Revocation").

Once the engines' queues are full, a request the dispatcher holds waits for every request queued ahead
of it inside an engine, whoever sent them: fair order ends at the engine's door. With ``revoke`` set,
a dispatch charge is *held* until its request starts, and a tenant that comes back is lifted to what
the least served has begun to get (counter less held: ``VirtualTokenCounter.rejoin``). When the policy's next
tenant cannot be placed, the dispatcher takes back, on the worker where it would start soonest (on
every worker for a tenant with nothing in the engines, which waits for the first slot to open), the
unstarted requests VTC would have served after it (by the tree's counters, compared where the two
tenants' paths part), so the waiting request goes in ahead of them and they follow it in the
policy's order. The worker answers
each with a finish whose reason is ``revoked`` only if its engine had not started it (then it never
will there); that finish puts it back at the head of its tenant's queue with its dispatch charge
refunded (``requeue``). One round is out at a time.

Revocation follows the counters, so it applies only under a policy that orders by them (``tree``):
under any other (FCFS, a rate limit) the policy could place the request taken back again before the
one it was taken back for, and the two would trade places for ever. Under a locality slack, only what
stays more than the slack ahead is taken: within it, the policy may serve that side first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fairgate.core.in_flight import InFlight
from fairgate.core.model import Request, Tenant
from fairgate.core.openings import BudgetUse, running_steps_left, steps_to_start
from fairgate.core.tenant_book import TenantBook
from fairgate.core.tree import SPARE, STRICT, TreeNode
from fairgate.core.workers import WorkerSlot, WorkerTable

BAND_ORDER = {STRICT: 0, SPARE: 2}  # served in this order; every other top-level member: the fair tree (1)


class Revocation:
    """Choosing what to take back, the requests asked for and not answered yet, and the dispatch
    charges held apart until their requests start (``enabled``: the ``revoke`` setting, under a policy
    that orders by counters; without it nothing is held and nothing taken back)."""

    __slots__ = ("_book", "_budget", "_in_flight", "_slack", "_workers", "enabled", "revoking")

    def __init__(
        self, enabled: bool, book: TenantBook, in_flight: InFlight, workers: WorkerTable, budget: BudgetUse
    ) -> None:
        self.enabled = enabled and book.policy.tree
        self._slack = book.policy.locality_slack
        self._book = book
        self._in_flight = in_flight
        self._workers = workers
        self._budget = budget
        self.revoking: dict[str, str] = {}  # request id -> worker: asked to take it back, no answer yet

    def revocations(self) -> list[tuple[str, str]]:
        """(request id, worker id) to take back now; called after ``assign``, so a tenant still waiting
        has nothing to place its next request on. None unless ``revoke`` is set, none while a round is
        out. Of each other tenant, its unstarted requests are taken newest first while, with them
        refunded, its side stays strictly ahead of the waiting one's: VTC would have served the waiting
        request before them, and does once they are back (and it, dispatched, is then ahead of them: no
        request is ever taken back for one that was taken back for it). Only on the worker where the
        waiting request would start soonest (``soonest``), or on all for a tenant that waits for the
        first slot to open anywhere (``waits_for_a_slot``)."""
        if not self.enabled or self.revoking or not len(self._in_flight):
            return []
        chosen = self._for_the_stalled() or self._for_the_queued()
        for rid, wid in chosen:
            self.revoking[rid] = wid
        return chosen

    def _for_the_stalled(self) -> list[tuple[str, str]]:
        """For the policy's next tenant, waiting in the dispatcher with nowhere to go: where it starts
        soonest once what it is owed there is taken back, or, when it has nothing in the engines, on
        every worker (it takes the first slot to open)."""
        tree = self._book.tree
        top = tree.pick()
        if top is None or top[2] is tree.spare:
            return []
        _, waiting, _ = top
        head = self._book.policy.next_request(waiting)
        if head.urgent:  # it has its own path past the engines' queues
            return []
        if self.waits_for_a_slot(waiting):
            queues = self._unstarted_by_worker()
            return [(rid, worker) for worker in queues for rid in self._owed(queues[worker], waiting)]
        found = self.soonest(waiting, head)
        if found is None:
            return []
        slot, taken, _ = found
        return [(rid, slot.id) for rid in taken]

    def waits_for_a_slot(self, t: Tenant) -> bool:
        """Whether ``t``'s next request, if it starts nowhere now, waits here for the first batch slot to
        open on any engine rather than in one engine's queue: it has nothing in the engines while others
        do (the queues hold what VTC would serve after it, taken back for it)."""
        return t.in_flight == 0 and bool(len(self._in_flight))

    def place_or_wait(self, waiting: Tenant, req: Request) -> WorkerSlot | None:
        """Where ``req`` of ``waiting`` goes when its placement would queue it in an engine: a worker
        that starts it now if there is one, else the queue it starts soonest in, if that queue has room;
        None: it waits here (for the first slot to open, or until what it is owed in the queue it starts
        soonest in is taken back)."""
        workers = self._workers
        now = [w for w in workers.fits(req.need, req.footprint or req.need, req.adapter) if w.starts_now(req.need)]
        if now:
            return now[0] if len(now) == 1 else workers.placement.choose(now, req)
        if self.waits_for_a_slot(waiting):
            return None
        found = self.soonest(waiting, req)
        return found[0] if found is not None and found[2] else None

    def soonest(self, waiting: Tenant, req: Request) -> tuple[WorkerSlot, list[str], bool] | None:
        """Where ``req`` of ``waiting``, which starts nowhere now, would start soonest: among the workers
        whose queue has room for it, and those holding unstarted requests VTC would serve after it
        (taken back for it); it waits there behind the other unstarted ones. With the requests to take
        back there (after it is placed, for one in a queue with room), and whether its queue has room
        now. None: nowhere."""
        queues = self._unstarted_by_worker()
        fits = {w.id for w in self._workers.fits(req.need, req.footprint or req.need, req.adapter)}
        left = running_steps_left(self._in_flight, self._budget)
        best: tuple[tuple[float, int, int, str], WorkerSlot, list[str]] | None = None
        for slot in self._workers.taking_work:
            if not slot.adapter_fits(req.adapter):
                continue
            by_tenant = queues.get(slot.id, {})
            taken = self._owed(by_tenant, waiting) if slot.kv_tokens >= req.need else []
            if not taken and slot.id not in fits:
                continue
            ahead = sum(len(reqs) for reqs in by_tenant.values()) - len(taken)
            key = (steps_to_start(slot, left.get(slot.id, []), ahead), ahead, len(taken), slot.id)
            if best is None or key < best[0]:
                best = (key, slot, taken)
        return None if best is None else (best[1], best[2], best[1].id in fits)

    def _unstarted_by_worker(self) -> dict[str, dict[str, list[Request]]]:
        """worker -> tenant -> its requests that worker holds unstarted."""
        queues: dict[str, dict[str, list[Request]]] = {}
        for req in self._in_flight:
            if not req.started and req.worker is not None:
                queues.setdefault(req.worker, {}).setdefault(req.tenant, []).append(req)
        return queues

    def _owed(self, by_tenant: Mapping[str, list[Request]], waiting: Tenant) -> list[str]:
        """Of the unstarted requests one worker holds (per tenant), those VTC would serve after
        ``waiting``'s next."""
        tenants = self._book.tenants
        return [rid for name, reqs in by_tenant.items() for rid in self._taken_from(tenants[name], reqs, waiting)]

    def _for_the_queued(self) -> list[tuple[str, str]]:
        """For a request already in an engine's queue behind others' unstarted requests (an engine
        takes its queue in the order it was given it): those of them VTC would have served after it,
        on the first worker where there are any, for the first such request in its queue."""
        queues: dict[str, list[Request]] = {}
        unstarted: dict[str, list[Request]] = {}
        tenants = self._book.tenants
        for req in self._in_flight:
            if not req.started and req.worker is not None:
                queues.setdefault(req.worker, []).append(req)
                unstarted.setdefault(req.tenant, []).append(req)
        for worker in sorted(queues):
            order = sorted(queues[worker], key=lambda r: r.handed)
            for i, behind in enumerate(order[1:], start=1):
                waiting = tenants.get(behind.tenant)
                if waiting is None or behind.urgent:
                    continue
                ahead = {r.id for r in order[:i]}
                taken = [
                    rid
                    for name in dict.fromkeys(r.tenant for r in order[:i])
                    for rid in self._taken_from(tenants[name], unstarted[name], waiting, behind, ahead)
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
        strictly ahead of the waiting side by more than the policy's locality slack. ``behind``: the
        waiting tenant's request already in an engine's queue behind them (the waiting side is compared
        without it), and ``among``: those ahead of it there, the only ones that may be taken."""
        if served is waiting:
            return []
        gap = self.over_service(served, waiting)
        newest_first = sorted(reqs, key=lambda r: -r.handed)
        if gap == math.inf:
            return [r.id for r in newest_first if _takable(r) and (among is None or r.id in among)]
        a, b = _parting(served, waiting)
        room = gap - self._slack + (behind.held / b.weight if behind is not None else 0.0)
        out: list[str] = []
        for req in newest_first:
            room -= req.held / a.weight
            if room <= 0:
                break
            if _takable(req) and (among is None or req.id in among):
                out.append(req.id)
        return out

    def settle_revoked(self, request_id: str) -> bool:
        """Its worker took ``request_id`` back before its engine started it: True when it is to wait
        again at the head of its tenant's queue, its dispatch charge refunded (one asked for before a
        restart too: the worker never runs it; counted as a revocation, whoever asked for it). False
        when it is not in flight here or has started (a stray answer: it runs, nothing changes)."""
        req = self._in_flight.get(request_id)
        if req is None or req.started:
            self.answered(request_id)
            return False
        self.revoking[request_id] = req.worker or ""
        slot = self._workers.get(req.worker or "")
        if slot is not None and slot.waiting > 0:  # its engine holds one fewer (an idle one reports no more)
            slot.waiting -= 1
            slot.touch()
        return True

    def taken_back(self, request_id: str) -> bool:
        """Whether ``request_id``, put back in its queue now, had been asked for (its caller may ask
        before its worker says); it is no longer out either way."""
        return self.revoking.pop(request_id, None) is not None

    def answered(self, request_id: str, refused: bool = False) -> None:
        """``request_id`` started or ended otherwise: it is no longer out to be taken back. ``refused``:
        its engine would not give it back, so it has begun there (it left its engine's queue for its
        batch); it is not asked for again."""
        if self.revoking:
            self.revoking.pop(request_id, None)
        req = self._in_flight.get(request_id) if refused else None
        if req is not None and not req.started:
            req.refused = True
            slot = self._workers.get(req.worker or "")
            if slot is not None:
                slot.took_back(req)
            req.beyond_room = False

    def hold(self, t: Tenant, req: Request, counter_before: float) -> None:
        """What ``req``'s dispatch charged ``t`` is held apart until it starts: a tenant that comes back
        is lifted to the service the least served one has begun to get, not to what engines hold for it."""
        if not self.enabled:
            return
        req.held = (t.counter - counter_before) * t.weight
        _move_held(req, self._book.tenants, self._book.tree.nodes, 1.0)

    def unhold(self, req: Request) -> None:
        """``req`` started, went back to its queue or ended: it is no longer held (nor out to be taken back)."""
        self.answered(req.id)
        if req.held:
            _move_held(req, self._book.tenants, self._book.tree.nodes, -1.0)
            req.held = 0.0

    def snapshot(self) -> dict[str, Any]:
        return {"revoking": dict(self.revoking)}

    def restore(self, data: Mapping[str, Any]) -> None:
        self.revoking = {str(rid): str(worker) for rid, worker in data["revoking"].items()}


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


def _takable(req: Request) -> bool:
    """Whether ``req`` may be taken back: not urgent (its class's objective placed it), not refused."""
    return not req.urgent and not req.refused


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
