"""First-token objectives enforced. A class whose ``on_miss`` is ``shed`` or ``downgrade`` has each new
request's first-token wait predicted at submission (``fairgate.core.wait_prediction``); a request
predicted to miss is refused at once or moved to a lower class of its own tenant, so enforcement only
ever touches the class's own requests and takes no one below their share. The requests it admits are
urgent: they may go a little ahead of their turn (at most their own cost ahead, on every level of the
tree), past the engines' queues, into KV the other requests leave free (``objective_reserve``), and
first in their engine's queue."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairgate.core.costs import CostFunction
from fairgate.core.model import Request, Tenant
from fairgate.core.predictors import MovingAveragePredictor
from fairgate.core.tenant_book import TenantBook
from fairgate.core.tree import TreeNode
from fairgate.core.wait_prediction import ObjectiveMiss, WaitPredictor
from fairgate.core.workers import WorkerSlot, WorkerTable


class Objectives:
    """Objective classes' predictions at submission, the leaves that may hold urgent requests, their
    checks at the first token, and the pool's rates the predictions use."""

    __slots__ = ("_book", "_cost", "_lengths", "_workers", "last_shed", "urgent_waiting", "waits")

    def __init__(
        self, book: TenantBook, workers: WorkerTable, cost: CostFunction, lengths: MovingAveragePredictor
    ) -> None:
        self._book = book
        self._workers = workers
        self._cost = cost
        self._lengths = lengths
        self.waits = WaitPredictor()  # first-token waits predicted and checked (objective classes)
        for c in book.classes.values():
            if c.ttft_s is not None:
                self.waits.add_class(c.name, c.ttft_s, c.on_miss)
        self.urgent_waiting: dict[str, Tenant] = {}  # leaves that may hold urgent requests (pruned lazily)
        self.last_shed: ObjectiveMiss | None = None  # the latest request shed by its class (its answer says why)

    @property
    def enforcing(self) -> bool:
        """Whether some class enforces its objective (each engine then keeps a reserve for it)."""
        return any(c.enforced for c in self._book.classes.values())

    def judge(
        self, tenant: str, klass: str, t: Tenant, prompt_tokens: int, max_tokens: int, resumed: bool, now: float
    ) -> tuple[Tenant, float | None, bool]:
        """(the leaf the request queues in, its predicted wait, whether it is shed). A request asked
        again after a dispatcher restart is not judged again."""
        book = self._book
        spec = book.classes.get(klass or book.default_class)
        if spec is None or spec.ttft_s is None or resumed:
            return t, None, False
        record = self.waits.records[spec.name]
        predicted = self._predicted_wait(t, prompt_tokens, max_tokens, now)
        self.last_shed = None
        if predicted is None or spec.on_miss == "queue" or self.waits.admits(spec.name, predicted, now):
            record.admit(now)
            return t, predicted, False
        if spec.on_miss == "shed":
            record.shed += 1
            self.last_shed = ObjectiveMiss(spec.name, spec.ttft_s, predicted + record.margin(now))
            return t, predicted, True
        record.downgraded += 1
        lower = book.class_leaf(tenant, spec.downgrade_to)
        target = book.classes[spec.downgrade_to]
        if target.ttft_s is None:
            return lower, None, False
        self.waits.records[target.name].admit(now)
        return lower, self._predicted_wait(lower, prompt_tokens, max_tokens, now), False

    def is_urgent(self, t: Tenant) -> bool:
        """Whether ``t`` is a leaf of a class that enforces its objective (its requests are urgent)."""
        spec = self._book.class_spec(t)
        return spec is not None and spec.enforced

    def waiting(self, t: Tenant) -> None:
        """An urgent request of ``t`` waits (again)."""
        self.urgent_waiting[t.name] = t

    def _predicted_wait(self, t: Tenant, prompt_tokens: int, max_tokens: int, now: float) -> float | None:
        """Its first-token wait, as modelled: nothing but the first token's delay when it would go at
        once (no request of its leaf ahead, its path within its reach of the least served, a worker to
        take it); else the pool's next dispatch, then the service its leaf must see go to others first
        and the cost of its requests ahead, at the leaf's share of the pool. The class's margin is
        added by ``WaitPredictor.admits``."""
        reach = self._cost.total(prompt_tokens, max_tokens)
        share, lag = self._standing(t, reach)
        total, usual = self._cost.total, self._lengths.predict
        ahead = lag
        for r in t.queue:
            ahead += total(r.prompt_tokens, usual(t.name, r.max_tokens, None) or r.max_tokens) / share
        starts_now = ahead <= 0 and self._workers.place(prompt_tokens + 1, _PROBE) is not None
        return self.waits.modelled(ahead, starts_now)

    def _standing(self, t: Tenant, reach: float) -> tuple[float, float]:
        """(the pool's share ``t`` is served at while it waits, the pool's service its path must see go
        to others before it goes). At each level its share is its weight over the weights of the members
        waiting there, itself included; a member whose key is above the smallest there by more than
        ``reach`` over its weight goes when the others have caught up, which takes that excess times
        their weights of its parent's service (a member not waiting joins at the smallest: no gap)."""
        tree = self._book.tree
        member: Tenant | TreeNode = t
        levels = []
        while True:
            node = tree.parent_of(member)
            entries = node.waiting.entries()
            weights = sum(node.kids[name].weight for name, _ in entries)
            gap = 0.0
            if member.name in node.waiting:
                lowest = min(tree.key_in(node.kids[name]) for name, _ in entries)
                gap = max(0.0, tree.key_in(member) - lowest - reach / member.weight)
            else:
                weights += member.weight
            levels.append((member.weight / weights, gap * weights))
            if node in tree.bands:
                break
            member = node
        share, lag = 1.0, 0.0
        for ratio, gap_cost in reversed(levels):  # from the top: a level's gap is paid at its parent's share
            lag += gap_cost / share
            share *= ratio
        return share, lag

    def urgent_pick(self) -> tuple[Tenant, Request, WorkerSlot] | None:
        """When the policy's next request must wait for the engines, an urgent request may go instead:
        the head of a leaf of an enforcing class whose key is, on every level of the tree up to its
        band, at most the request's own cost over the member's weight above the smallest waiting there
        (the deviation the stated bound adds), if a worker takes it. Leaves found empty are forgotten."""
        if not self.urgent_waiting:
            return None
        total, tenants = self._cost.total, self._book.tenants
        for name, leaf in list(self.urgent_waiting.items()):
            if not leaf.queue or tenants.get(name) is not leaf:
                del self.urgent_waiting[name]
                continue
            req = leaf.queue[0]
            if not req.urgent or not self._within_reach(leaf, total(req.prompt_tokens, req.max_tokens)):
                continue
            slot = self._workers.place(req.need, req)
            if slot is not None:
                return leaf, req, slot
        return None

    def _within_reach(self, leaf: Tenant, reach: float) -> bool:
        tree = self._book.tree
        member: Tenant | TreeNode = leaf
        while True:
            node = tree.parent_of(member)
            top = node.waiting.peek()
            if top is not None and tree.key_in(member) > top[0] + reach / member.weight:
                return False
            if node in tree.bands:
                return True
            member = node

    def first_output(self, req: Request, now: float) -> None:
        """``req``'s first token came at ``now``: the first-token delay is measured, and an objective
        class's prediction checked."""
        delay = None if req.dispatched_at is None else now - req.dispatched_at
        self.waits.first_token(self._book.class_of(req.tenant), req.predicted_wait, now - req.arrival, delay, now)

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, Any]:
        shed = self.last_shed
        return {
            "waits": self.waits.snapshot(),
            "urgent_waiting": list(self.urgent_waiting),
            "last_shed": None if shed is None else [shed.klass, shed.objective_s, shed.predicted_s],
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        """After the book's restore (the leaves named here are its own)."""
        self.waits.restore(data["waits"])
        tenants = self._book.tenants
        self.urgent_waiting = {name: tenants[name] for name in data["urgent_waiting"] if name in tenants}
        shed = data["last_shed"]
        self.last_shed = None if shed is None else ObjectiveMiss(str(shed[0]), float(shed[1]), float(shed[2]))


_PROBE = Request("", "", 0, 1, 0.0, 0, 0, urgent=True)  # stands for a new urgent request in placement checks
