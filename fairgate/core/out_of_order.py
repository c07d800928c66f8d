"""The ways a request other than the policy's next one may go first: the locality slack (a tenant within
Δ of the least served with a longer cached prefix, or whose adapter an engine's batch has room for
while the next one's has none, docs/architecture.md) and relaxed head-of-line (the next tenant whose
request fits). Each only reads the scheduler's tables and says what to dispatch (the adapter slack
also tells an engine's batch to make room)."""

from __future__ import annotations

from fairgate.core.continuations import Continuations
from fairgate.core.in_flight import InFlight
from fairgate.core.model import Request, Tenant
from fairgate.core.openings import BudgetUse, steps_left
from fairgate.core.prefix_index import PrefixIndex
from fairgate.core.tenant_book import TenantBook
from fairgate.core.tree import TreeNode
from fairgate.core.workers import WorkerSlot, WorkerTable

LOCAL_TENANTS = 8  # locality slack: tenants looked at per decision, and requests of each
LOCAL_WINDOW = 16
HOMED_WINDOW = 16  # requests homed on a worker looked at per decision
MAX_PASSES = 8  # a head request passed over this often for a cached prefix goes next
ADAPTER_TENANTS = 64  # adapter slack: tenants looked at while a blocked adapter waits for room


Pick = tuple[Tenant, Request, WorkerSlot]


class OutOfOrderPicks:
    """Picks outside the policy's strict order, each within its stated slack (``slack``: the policy's
    Δ, 0 for none; ``relaxed_scan``: tenants the relaxed head-of-line rule looks at)."""

    __slots__ = ("_book", "_budget", "_continuations", "_in_flight", "_prefixes", "_workers", "relaxed_scan", "slack")

    def __init__(
        self,
        book: TenantBook,
        workers: WorkerTable,
        prefixes: PrefixIndex,
        continuations: Continuations,
        in_flight: InFlight,
        budget: BudgetUse,
        relaxed_scan: int,
    ) -> None:
        self._book = book
        self._workers = workers
        self._prefixes = prefixes
        self._continuations = continuations
        self._in_flight = in_flight
        self._budget = budget
        self.slack = book.policy.locality_slack  # 0: the policy's order exactly
        self.relaxed_scan = relaxed_scan

    def local_pick(self, floor: float, top: Tenant, head: Request, parent: TreeNode) -> Pick | None:
        """Locality slack (docs/architecture.md): among the waiting tenants whose key is within the policy's
        slack of the smallest (at most ``LOCAL_TENANTS`` of them, in order; a tenant of weight w
        within Δ / w, so that the weighted bound holds for every pair), and among the first
        ``LOCAL_WINDOW`` requests of each, the request that finds the longest cached prefix on a
        worker that can start it now. A head request passed over ``MAX_PASSES`` times by later ones
        of its tenant goes first. Returns the pick (``head`` of ``top`` itself when no one gains
        over it), or None when ``head`` cannot start and no one else gains (the usual rules apply).
        In a tree, the tenants looked at are ``top``'s siblings (``parent``'s waiting leaves)."""
        place, expected = self._workers.place, self._prefixes.expected_tokens
        head_slot = place(head.need, head)
        head_gain = 0 if head_slot is None else expected(head_slot.id, head.prefix, head.block_tokens)
        if head_gain >= min(len(head.prefix) * head.block_tokens, head.prompt_tokens - 1):
            return None if head_slot is None else (top, head, head_slot)  # nothing can beat a full hit
        slack, key = self.slack, self._book.key
        best: tuple[int, Tenant, Request, WorkerSlot] | None = None
        kids = parent.kids
        for name in parent.waiting.smallest(LOCAL_TENANTS):
            t = kids[name]
            if not isinstance(t, Tenant) or key(name) > floor + slack / t.weight:
                continue  # entries below the top may hold stale keys: check each
            queue = t.queue
            window = 1 if queue[0].passed >= MAX_PASSES else LOCAL_WINDOW
            for i, req in enumerate(queue):
                if i >= window:
                    break
                if not req.prefix or req is head:
                    continue
                slot = place(req.need, req)
                if slot is None:
                    continue
                gain = expected(slot.id, req.prefix, req.block_tokens)
                if gain > head_gain and (best is None or gain > best[0]):  # a longer cached prefix, never none
                    best = (gain, t, req, slot)
        best = self._homed_pick(floor, head, parent, head_gain, best)
        if best is None:
            return None if head_slot is None else (top, head, head_slot)
        _, t, req, slot = best
        if t.queue[0] is not req:
            t.queue[0].passed += 1
        return t, req, slot

    def _homed_pick(
        self,
        floor: float,
        head: Request,
        parent: TreeNode,
        gain_to_beat: int,
        best: tuple[int, Tenant, Request, WorkerSlot] | None,
    ) -> tuple[int, Tenant, Request, WorkerSlot] | None:
        """``best`` of ``_local_pick``, or a request homed on a worker that can take work now
        (``continuations``: it extends one dispatched there) if it finds more cached there: at most
        ``HOMED_WINDOW`` per worker, most recently homed first, of tenants ``_local_pick`` may pick
        (the top one included: its own later request may go before its head, as a window's would)."""
        homes = self._continuations.homes
        if not homes:
            return best
        takes, expected = self._workers.takes, self._prefixes.expected_tokens
        slack, key, kids, waiting = self.slack, self._book.key, parent.kids, parent.waiting
        tenants, slots = self._book.tenants, self._workers.slots
        for worker_id in list(homes):
            slot = slots.get(worker_id)
            if slot is None:
                continue
            for i, req in enumerate(self._continuations.homed(worker_id)):
                if i >= HOMED_WINDOW:
                    break
                if req is head:
                    continue
                t = tenants.get(req.tenant)
                if t is None or kids.get(t.name) is not t or t.name not in waiting:
                    continue
                if t.queue[0].passed >= MAX_PASSES or key(t.name) > floor + slack / t.weight:
                    continue
                if req.urgent or not takes(slot, req):
                    continue
                gain = expected(worker_id, req.prefix, req.block_tokens)
                if gain > gain_to_beat and (best is None or gain > best[0]):
                    best = (gain, t, req, slot)
        return best

    def adapter_pick(self, floor: float, top: Tenant, head: Request, parent: TreeNode) -> Pick | None:
        """``head`` cannot go anywhere because no engine's batch has room for its adapter (it would fit
        otherwise): room is made for it (``_make_room``), and meanwhile the first waiting tenant in
        order within the locality slack whose next request can go now goes (a tenant of weight w within
        Δ / w: the bound grows by Δ, as for a cached prefix). None: no one."""
        workers = self._workers
        if any(w.adapter_fits(head.adapter) for w in workers.taking_work):
            return None  # its adapter is not what holds it back
        self._make_room(head)
        if self.slack <= 0:
            return None
        slack, key, kids = self.slack, self._book.key, parent.kids
        for name in parent.waiting.smallest(ADAPTER_TENANTS):
            t = kids[name]
            if t is top or not isinstance(t, Tenant) or key(name) > floor + slack / t.weight:
                continue
            req = self._book.policy.next_request(t)
            slot = workers.place(req.need, req)
            if slot is not None:
                return t, req, slot
        return None

    def _make_room(self, head: Request) -> None:
        """Of the adapters in the engines' batches, the one expected to leave its batch soonest gets no
        more requests there (unless room is being made for ``head``'s adapter already): by its
        requests' expected steps left (``openings.steps_left``; one not started: all of its output),
        on a worker not making room for another. Every other adapter keeps its batch full meanwhile."""
        workers = self._workers
        chosen = workers.room_being_made(head.adapter)
        if chosen is None:
            last: dict[tuple[str, str], int] = {}
            for req in self._in_flight:
                slot = workers.get(req.worker or "")
                if not req.adapter or slot is None or slot.draining or not slot.max_loras:
                    continue
                if head.need > slot.kv_tokens or slot.leaving:
                    continue
                left = (
                    steps_left(req, self._budget)
                    if req.started
                    else self._budget.expected_output(req.tenant, req.max_tokens)
                )
                key = (slot.id, req.adapter)
                last[key] = max(last.get(key, 0), left)
            if not last:
                return
            chosen = min(last, key=lambda k: (last[k], k))
        workers.make_room(head.adapter, *chosen)

    def relaxed_pick(self, parent: TreeNode) -> Pick | None:
        """Relaxed head-of-line: the first tenant in the policy's order whose next request fits (in a
        tree: among the siblings of the one that did not fit)."""
        for name in parent.waiting.smallest(self.relaxed_scan)[1:]:
            t = parent.kids[name]
            if not isinstance(t, Tenant):
                continue
            req = self._book.policy.next_request(t)
            slot = self._workers.place(req.need, req)
            if slot is not None:
                return t, req, slot
        return None
