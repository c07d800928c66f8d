"""The fair scheduler: per-tenant queues, the waiting set, the worker table, driven by a fairness policy.

This is the one implementation of dispatching (DESIGN §1). It is pure: no I/O, no clock, no threads;
every event carries ``now``. The simulator, the Ray actor and the tests all drive it through the same
events: ``submit``, ``assign``, ``on_report``, ``on_finish``, ``cancel``, ``worker_join``,
``worker_drain``, ``worker_leave``, ``requeue``, ``adopt``. What is fair is the policy's to say
(``dispatcher.core.policies``), where a request runs is the placement rule's
(``dispatcher.core.placement``), and what it costs is the ledger's (``dispatcher.core.ledger``); this
module keeps the books consistent between them. Snapshots are in ``dispatcher.core.snapshots``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from dispatcher.core import snapshots
from dispatcher.core.capacity import Demand
from dispatcher.core.classes import RequestClass, check_classes, default_class, leaf_name
from dispatcher.core.costs import CostFunction, LinearCost, cost_from_spec
from dispatcher.core.fairness import engine_queue_slack, unit_u
from dispatcher.core.ledger import Ledger
from dispatcher.core.model import Request, Tenant
from dispatcher.core.placement import make_placement
from dispatcher.core.policies import FairnessPolicy, make_policy
from dispatcher.core.predictors import MovingAveragePredictor
from dispatcher.core.prefix_index import PrefixIndex
from dispatcher.core.reasons import (
    REJECT_QUEUE_FULL,
    REJECT_RATE_LIMITED,
    REJECT_TENANT_QUEUE_FULL,
    REJECT_TOO_LARGE,
)
from dispatcher.core.tree import CLASS_SEP, ROOT, STRICT, TenantTree, TreeError, TreeNode
from dispatcher.core.workers import WorkerSlot, WorkerTable

LOCAL_TENANTS = 8  # locality slack: tenants looked at per decision, and requests of each
LOCAL_WINDOW = 16
MAX_PASSES = 8  # a head request passed over this often for a cached prefix goes next
FOOTPRINT_HEADROOM = 1.5  # a footprint covers half as much again as the tenant's recent mean output
PRIORITY_SCALE = 100  # preemption ranks in hundredths of a request in flight per unit of weight


@dataclass(frozen=True)
class SchedulerConfig:
    """Knobs of the scheduler. ``policy``: the fairness policy's spec (``vtc``, ``rpm:5``, ...);
    ``placement``: the placement rule's name.

    ``strict_head_of_line``: when the policy's next request fits nowhere, stop (True, the default) or
    try up to ``relaxed_scan`` further tenants in the policy's order.
    Admission is by each engine's own rule (``dispatcher.core.workers``): nothing is reserved for a
    request's output, so a tenant that asks for far more ``max_tokens`` than it uses holds nothing
    beyond what it uses. ``max_engine_waiting``: the most requests that may wait inside one engine
    beyond those it can start now (the queue's depth follows the engine's turnover up to this; 0: no
    queue, so an engine may lack work while its next assignment is on its way); the fairness bound
    grows with it (``fairness_bound``). ``overcommit``: the requests in flight on a worker are expected
    to reach at most this many KV pools (each its prompt and its tenant's usual output, the mean of its
    last 20 times ``FOOTPRINT_HEADROOM``, ``max_tokens`` while nothing is known): past one pool the
    engine preempts, as it does alone; the cap keeps a tenant of tiny prompts and long outputs from
    filling an engine with far more than it can hold, whose growth would otherwise run past VTC's
    bound while the others wait (admitted by prompt alone, such a tenant broke it 2.5x in the paper's
    ``poisson_short_long_2``; with the cap at 2 it stays at 0.43 of it).
    ``max_queued_per_tenant`` / ``max_queued``: caps on requests waiting (one tenant's / everyone's);
    ``max_queue_s``: a request still waiting after this long is withdrawn (``expire``). None: no limit.
    ``classes``: the request classes (``dispatcher.core.classes``; the first one not strict is the
    default); they, like a tenant tree, need a policy that orders by counters (``FairnessPolicy.tree``).
    """

    policy: str = "vtc"
    cost: CostFunction = field(default_factory=LinearCost)
    placement: str = "most-room"
    strict_head_of_line: bool = True
    relaxed_scan: int = 16
    max_engine_waiting: int = 8
    overcommit: float = 2.0
    seed: int = 0
    max_queued_per_tenant: int | None = None
    max_queued: int | None = None
    max_queue_s: float | None = None
    classes: tuple[RequestClass, ...] = ()

    def __post_init__(self) -> None:
        policy = make_policy(self.policy, self.seed)  # refuses unknown ones
        object.__setattr__(self, "policy", policy.spec)
        object.__setattr__(self, "classes", check_classes(self.classes))
        if self.classes and not policy.tree:
            raise ValueError(f"request classes need a policy that orders by counters, not {policy.name!r}")
        make_placement(self.placement)
        if not self.overcommit >= 1.0:
            raise ValueError(f"overcommit must be at least 1, got {self.overcommit}")
        if self.max_engine_waiting < 0:
            raise ValueError(f"max_engine_waiting must be >= 0, got {self.max_engine_waiting}")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "cost": self.cost.spec(),
            "classes": [c.to_dict() for c in self.classes],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SchedulerConfig:
        policy = data.get("policy", "vtc")
        return cls(
            policy=policy["name"] if isinstance(policy, Mapping) else str(policy),  # older configs: a record
            cost=cost_from_spec(data.get("cost")),
            placement=str(data.get("placement", "most-room")),
            strict_head_of_line=bool(data.get("strict_head_of_line", True)),
            relaxed_scan=int(data.get("relaxed_scan", 16)),
            max_engine_waiting=int(data.get("max_engine_waiting", 8)),
            overcommit=float(data.get("overcommit", 2.0)),
            seed=int(data.get("seed", 0)),
            max_queued_per_tenant=_optional(data.get("max_queued_per_tenant"), int),
            max_queued=_optional(data.get("max_queued"), int),
            max_queue_s=_optional(data.get("max_queue_s"), float),
            classes=tuple(RequestClass.from_dict(c) for c in data.get("classes") or ()),
        )


# what a request that ran was charged, kept for its re-announcement: prompt, output, charged output,
# the weight and tree path its charges were divided by
Settled = tuple[int, int, int, float, tuple[tuple[str, float], ...]]


class Assignment(NamedTuple):
    """A decision: start ``request`` on worker ``worker_id`` now."""

    request: Request
    worker_id: str


@dataclass(frozen=True, slots=True)
class LeaveResult:
    """What a departing worker left behind: requests put back in their queues, and requests lost."""

    requeued: list[str]
    lost: list[str]


class FairScheduler:
    """Per-tenant queues and counters, the waiting set and the worker table, under one policy."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.policy: FairnessPolicy = make_policy(self.config.policy, self.config.seed)
        self.cost = self.config.cost
        self.ledger = Ledger(self.cost)  # its nodes: the tree's, below
        self.prefixes = PrefixIndex()  # which prompt blocks each worker probably caches
        placement = make_placement(self.config.placement)
        placement.attach(self.prefixes)
        self.workers = WorkerTable(placement, self.config.max_engine_waiting, self.config.overcommit)
        self.lengths = MovingAveragePredictor()  # what each tenant's requests generate: their footprints
        self._slack = self.policy.locality_slack  # 0: the policy's order exactly
        self.tenants: dict[str, Tenant] = {}
        self._key = self.policy.key_function(self.tenants)
        self.tree = TenantTree(self.tenants, self._key, self.policy.rejoin)
        self.ledger.nodes = self.tree.nodes
        self._waiting = self.tree.root.waiting
        self.classes = {c.name: c for c in self.config.classes}
        self.default_class = default_class(self.config.classes)
        self._in_flight: dict[str, Request] = {}
        self._queued_ids: dict[str, str] = {}  # queued request id -> its tenant
        self._arrivals: list[tuple[float, int, str]] = []  # heap of (arrival, seq, id), only with max_queue_s
        self._next_seq = 0
        # id -> (prompt, output, charged output, weight charged at) of requests that ran when their worker
        # or this dispatcher went away: what a re-announcement is charged beyond
        self._settled: dict[str, Settled] = {}
        self._resumed: set[str] = set()  # tenants waiting when the durable state was written (not lifted)
        self.longest_prompt = 0  # of every request submitted, and the largest max_tokens: for 2U
        self.longest_output = 0
        self.dropped: list[tuple[Request, str]] = []

    # ----------------------------------------------------------------- tenants

    def add_tenant(self, name: str, weight: float = 1.0, parent: str | None = None) -> Tenant:
        """Register a tenant (or change its weight, and with ``parent`` move it under that tree node;
        None: where it is, the root for a new one); takes effect on the next dispatch. A tenant with
        request classes is weighted (and moved) as its own node."""
        if not weight > 0:
            raise ValueError(f"tenant {name!r}: weight must be positive, got {weight}")
        if parent and not self.policy.tree:
            raise ValueError(f"a tenant tree needs a policy that orders by counters, not {self.policy.name!r}")
        tenant = self.tenants.get(name)
        if tenant is None:
            own = self.tree.nodes.get(name)
            if own is not None:
                raise TreeError(f"{name!r} is a tree node; a tenant needs a name of its own")
            tenant = Tenant(name, float(weight))
            self.tree.attach(tenant, parent or ROOT)  # refuses an unknown parent before anything changes
            self.tenants[name] = tenant
            return tenant
        own = self._class_node(tenant)
        if own is not None:
            self.tree.set_node(name, parent, float(weight))
            return tenant
        if parent is not None and parent != tenant.parent:
            self.tree.move(tenant, parent)
        before = self._key_if_waiting(tenant)
        tenant.weight = float(weight)
        self._rekey_if_lower(tenant, before)
        return tenant

    def set_node(self, name: str, parent: str | None = None, weight: float | None = None) -> TreeNode:
        """Create a tree node under ``parent`` (None: the root), or move and reweight one; takes effect
        on the next dispatch. Raises ``TreeError`` for a cycle, an unknown parent or a weight <= 0."""
        if not self.policy.tree:
            raise ValueError(f"a tenant tree needs a policy that orders by counters, not {self.policy.name!r}")
        return self.tree.set_node(name, parent, weight)

    def delete_node(self, name: str) -> None:
        """Remove an empty tree node (its past service stays counted in the nodes above it)."""
        node = self.tree.node(name)
        if node.implicit:
            raise TreeError(f"{name!r} is a tenant's own node (its request classes)")
        self.tree.delete_node(name)

    def class_leaf(self, tenant: str, klass: str = "") -> Tenant:
        """The leaf that queues ``tenant``'s requests of class ``klass`` ("" or the default class: the
        tenant's own), created on first use under the tenant's own node (a strict class: in the
        strict band). Raises ValueError for an unknown class."""
        t = self.tenants.get(tenant) or self.add_tenant(tenant)
        name = leaf_name(tenant, klass, self.default_class)
        if name == tenant:
            return t
        spec = self.classes.get(klass)
        if spec is None:
            raise ValueError(f"unknown request class {klass!r}")
        leaf = self.tenants.get(name)
        if leaf is None:
            parent = STRICT if spec.strict else self._own_node(t).name
            leaf = Tenant(name, spec.weight)
            self.tree.attach(leaf, parent)
            self.tenants[name] = leaf
        return leaf

    # ------------------------------------------------------------------ events

    def submit(
        self,
        request_id: str,
        tenant: str,
        prompt_tokens: int,
        max_tokens: int,
        now: float,
        true_output: int | None = None,
        resumed: bool = False,
        prefix: tuple[int, ...] = (),
        block_tokens: int = 0,
        klass: str = "",
    ) -> str | None:
        """Queue a request. Returns None when accepted, else the reason it was rejected. ``resumed``: a
        request admitted before (its caller asks again after a dispatcher restart): the policy's
        admission (e.g. RPM's window) is not asked again. ``prefix``: the chained hashes of its prompt's
        blocks of ``block_tokens`` tokens (for cache-aware placement, order and cost). ``klass``: its
        request class ("": the default); the request's ``tenant`` is then its class's leaf."""
        if request_id in self._in_flight or request_id in self._queued_ids:
            raise ValueError(f"duplicate request id {request_id!r}")
        if prompt_tokens < 0 or max_tokens < 1:
            raise ValueError("prompt_tokens must be >= 0 and max_tokens >= 1")
        t = self.class_leaf(tenant, klass)
        tenant = t.name
        t.submitted += 1
        largest = self.workers.largest_pool
        if largest and prompt_tokens + max_tokens > largest:  # could it ever run alone: its full size
            t.rejected += 1
            return REJECT_TOO_LARGE
        config = self.config
        if config.max_queued_per_tenant is not None and self._queued_of(t) >= config.max_queued_per_tenant:
            t.rejected += 1
            return REJECT_TENANT_QUEUE_FULL
        if config.max_queued is not None and len(self._queued_ids) >= config.max_queued:
            t.rejected += 1
            return REJECT_QUEUE_FULL
        if not resumed and not self.policy.admit(t, now):  # last: a refusal for another reason uses no slot
            t.rejected += 1
            return REJECT_RATE_LIMITED
        need = _admission_need(prompt_tokens)
        req = Request(request_id, tenant, prompt_tokens, max_tokens, now, self._next_seq, need, true_output)
        if prefix and block_tokens > 0:
            req.prefix, req.block_tokens = tuple(prefix), block_tokens
        self._next_seq += 1
        if prompt_tokens > self.longest_prompt:
            self.longest_prompt = prompt_tokens
        if max_tokens > self.longest_output:
            self.longest_output = max_tokens
        if not t.queue:
            lift = tenant not in self._resumed  # it was waiting when the dispatcher stopped: never idle
            self._resumed.discard(tenant)
            t.queue.append(req)
            self.tree.join(t, lift)
        else:
            t.queue.append(req)
        t.queued_tokens += prompt_tokens + max_tokens
        self._queued_ids[request_id] = tenant
        if config.max_queue_s is not None:
            heapq.heappush(self._arrivals, (now, req.seq, request_id))
        return None

    def assign(self, now: float) -> list[Assignment]:
        """Dispatch, in the policy's order, every request that can start now."""
        out: list[Assignment] = []
        if not self.workers.slots:
            return out
        pick, place, has_slack = self.tree.pick, self.workers.place, self.workers.has_slack
        next_request = self.policy.next_request
        while has_slack():
            top = pick()
            if top is None:
                break
            key, tenant, parent = top
            req = next_request(tenant)
            if self._slack > 0 and req.prefix and self.prefixes.used:
                picked = self._local_pick(key, tenant, req, parent)
                if picked is not None:
                    picked_tenant, picked_req, slot = picked
                    at_top = picked_req is req
                    out.append(Assignment(self._dispatch(picked_tenant, picked_req, slot, now, at_top), slot.id))
                    continue
            slot = place(req.need, req)
            if slot is None:
                largest = self.workers.largest_pool
                if largest and req.prompt_tokens + req.max_tokens > largest:
                    self._drop(tenant, req, REJECT_TOO_LARGE)
                    continue
                if self.config.strict_head_of_line:
                    break
                picked = self._relaxed_pick(parent)
                if picked is None:
                    break
                tenant, req, slot = picked
                out.append(Assignment(self._dispatch(tenant, req, slot, now, at_top=False), slot.id))
                continue
            out.append(Assignment(self._dispatch(tenant, req, slot, now, at_top=True), slot.id))
        return out

    def on_report(
        self,
        worker_id: str,
        new_tokens: Mapping[str, int],
        *,
        started: Mapping[str, int] | None = None,
        free_tokens: int | None = None,
        running: int | None = None,
        waiting: int | None = None,
        cached: Mapping[str, int] | None = None,
    ) -> None:
        """One engine step of one worker: requests started (exact prompt tokens, and ``cached``: how
        many of them the engine found in its prefix cache) and tokens generated."""
        in_flight = self._in_flight
        if started:
            for rid, prompt_tokens in started.items():
                req = in_flight.get(rid)
                if req is not None and not req.started:
                    self._mark_started(req, prompt_tokens, None if cached is None else cached.get(rid))
        tenants, ledger = self.tenants, self.ledger
        for rid, k in new_tokens.items():
            req = in_flight.get(rid)
            if req is None or k <= 0:
                continue
            if not req.started:
                self._mark_started(req, req.prompt_tokens)
            t = tenants[req.tenant]
            t.output_tokens += k
            n_p, old, charged = req.prompt_tokens, req.output_tokens, req.charged_output
            new = old + k
            if charged == old:  # nothing charged ahead: the counter moves with the service
                ledger.account(t, ((n_p, old), (n_p, new)))
                req.output_tokens = req.charged_output = new
                continue
            reached = new if new > charged else charged  # tokens within a prediction were charged ahead
            ledger.account(t, ((n_p, old), (n_p, new)), ((n_p, charged), (n_p, reached)))
            req.output_tokens, req.charged_output = new, reached
        slot = self.workers.slots.get(worker_id)
        if slot is not None:
            if free_tokens is not None:
                slot.free_tokens = free_tokens
                slot.observe_starts(len(started) if started else 0)
            if running is not None:
                slot.running = running
            if waiting is not None:
                slot.waiting = waiting

    def on_finish(self, request_id: str, output_tokens: int, reason: str, now: float) -> Request | None:
        """A request ended on its worker: settle its charges and free its reservation."""
        req = self._in_flight.get(request_id)
        if req is None:
            return None
        if output_tokens > req.output_tokens:
            self.on_report(req.worker or "", {request_id: output_tokens - req.output_tokens})
        del self._in_flight[request_id]
        t = self.tenants[req.tenant]
        before = self._key_if_waiting(t)
        if not req.started and req.output_tokens == 0:
            self._refund_dispatch(t, req)
        else:
            self._settle_prediction(t, req)
        self._release(req)
        t.in_flight -= 1
        t.finished += 1
        self._rekey_if_lower(t, before)
        if reason in ("stop", "length"):
            self.policy.observe(req.tenant, req.output_tokens)
        if req.started:  # an aborted request teaches it too: a footprint is what requests use
            self.lengths.observe(req.tenant, req.output_tokens)
        return req

    def cancel(self, request_id: str) -> bool:
        """Withdraw a request still waiting in its queue (client gone). In-flight ones are aborted at
        their worker, whose finish event settles them."""
        return self._withdraw(request_id, None)

    def expire(self, now: float) -> list[str]:
        """Withdraw the requests that have waited longer than ``max_queue_s`` since they arrived (one
        put back in its queue after a failed placement included); returns their ids."""
        limit = self.config.max_queue_s
        if limit is None:
            return []
        expired: list[str] = []
        arrivals = self._arrivals
        while arrivals and arrivals[0][0] <= now - limit:
            _, seq, request_id = heapq.heappop(arrivals)
            if self._withdraw(request_id, seq):  # the same submission, not a later one with its id
                expired.append(request_id)
        return expired

    def worker_join(
        self,
        worker_id: str,
        kv_tokens: int,
        max_running: int | None = None,
        free_tokens: int | None = None,
        watermark: int = 0,
    ) -> None:
        """A worker takes work: its KV pool, batch limit, free KV now and admission watermark (tokens)."""
        self.workers.join(worker_id, kv_tokens, max_running, free_tokens, watermark)
        self.prefixes.join(worker_id, kv_tokens)

    def worker_drain(self, worker_id: str) -> None:
        """Stop assigning to a worker; what it runs finishes there."""
        self.workers.drain(worker_id)

    def worker_leave(self, worker_id: str) -> LeaveResult:
        """A worker is gone. Requests it had not started go back to the head of their queues, their
        dispatch charge refunded; requests that had started end as lost (what they were charged is kept,
        so that the worker re-announcing them after a broken stream charges only what is new)."""
        self.workers.leave(worker_id)
        self.prefixes.leave(worker_id)
        mine = sorted((r for r in self._in_flight.values() if r.worker == worker_id), key=lambda r: -r.seq)
        requeued: list[str] = []
        lost: list[str] = []
        for req in mine:
            if not req.started:
                self.requeue(req.id)
                requeued.append(req.id)
                continue
            t = self.tenants[req.tenant]
            before = self._key_if_waiting(t)
            del self._in_flight[req.id]
            self._settle_prediction(t, req)  # it ends here: a prediction it never reached is not kept
            t.in_flight -= 1
            t.finished += 1
            self._rekey_if_lower(t, before)
            self._settled[req.id] = (req.prompt_tokens, req.output_tokens, req.charged_output, req.weight, req.path)
            lost.append(req.id)
        requeued.reverse()
        return LeaveResult(requeued, lost)

    def requeue(self, request_id: str) -> bool:
        """An assigned request that never started (its worker died, or its caller could not reach the
        worker) goes back to the head of its tenant's queue with its dispatch charge refunded."""
        req = self._in_flight.get(request_id)
        if req is None or req.started:
            return False
        t = self.tenants[req.tenant]
        before = self._key_if_waiting(t)
        del self._in_flight[request_id]
        t.in_flight -= 1
        self._release(req)
        self._refund_dispatch(t, req)
        req.worker, req.dispatched_at, req.predicted, req.charged_output = None, None, 0, 0
        t.queue.appendleft(req)
        if before is None:  # it waits again, ahead of everything it sent later, as it did before
            self.tree.join(t, lift=False)
            self.tree.rekey_ancestors(t)  # the refund lowered the counters above it
        else:
            self._rekey_if_lower(t, before)
        t.queued_tokens += req.prompt_tokens + req.max_tokens
        self._queued_ids[req.id] = t.name
        if self.config.max_queue_s is not None:  # it waits again, still counted from its arrival
            heapq.heappush(self._arrivals, (req.arrival, req.seq, req.id))
        return True

    def adopt(
        self, worker_id: str, request_id: str, tenant: str, prompt_tokens: int, max_tokens: int, output_tokens: int
    ) -> bool:
        """A worker announces a running request this scheduler does not track (after a dispatcher
        restart, or a worker's stream that broke). It is taken into the tables and charged what it has
        consumed beyond what was charged for it before (``restore_durable`` / ``worker_leave``). One
        still tracked there (the old stream's end not seen yet) is brought to the announced count: the
        reports in between were lost. Returns whether it was taken in."""
        slot = self.workers.get(worker_id)
        known = self._in_flight.get(request_id)
        if known is not None and known.worker == worker_id and output_tokens > known.output_tokens:
            self.on_report(worker_id, {request_id: output_tokens - known.output_tokens})
        if slot is None or known is not None:
            return False
        if request_id in self._queued_ids:  # a copy re-queued meanwhile: the original runs
            self.cancel(request_id)
        t = self.tenants.get(tenant) or self._leaf_named(tenant)
        settled = self._settled.pop(request_id, None)
        before_p, before_out, before_charged, weight, path = settled or (0, 0, 0, t.weight, None)
        if path is None:  # charged afresh: to the nodes above it now
            path = tuple((node.name, node.weight) for node in t.ancestors)
        known = settled is not None  # charged before, even if only h(0, 0) (an empty prompt, no output yet)
        charged = max(output_tokens, before_charged)
        self.ledger.account(
            t,
            ((before_p, before_out) if known else None, (prompt_tokens, output_tokens)),
            ((before_p, before_charged) if known else None, (prompt_tokens, charged)),
            path=path,  # where its earlier charges went, at those weights
        )
        t.output_tokens += max(0, output_tokens - before_out)
        length = max(max_tokens, output_tokens, 1)
        need = _admission_need(prompt_tokens)
        req = Request(request_id, tenant, prompt_tokens, length, 0.0, self._next_seq, need)
        self._next_seq += 1
        req.worker, req.started, req.weight = worker_id, True, weight  # a prediction's refund: its weight
        req.path = path
        req.output_tokens, req.charged_output = output_tokens, charged
        slot.committed += need
        slot.in_flight += 1
        t.in_flight += 1
        self._in_flight[request_id] = req
        return True

    def settle_ended(
        self,
        worker_id: str,
        request_id: str,
        tenant: str,
        prompt_tokens: int,
        max_tokens: int,
        output_tokens: int,
        now: float,
    ) -> bool:
        """A worker says a request ended on it with ``output_tokens``, in a hello after its stream
        broke or this dispatcher restarted. Settle it exactly once: a request this scheduler lost
        with the worker (or put back in its queue, or placed again elsewhere without starting) is
        adopted and finished; one it still tracks there is brought to its final count and finished;
        one already finished is left alone. True when it was settled here."""
        req = self._in_flight.get(request_id)
        if req is not None and req.worker == worker_id:
            if output_tokens > req.output_tokens:
                self.on_report(worker_id, {request_id: output_tokens - req.output_tokens})
            self.on_finish(request_id, output_tokens, "stop", now)
            return True
        if req is None and request_id not in self._settled and request_id not in self._queued_ids:
            return False  # finished here before: nothing to do
        if req is not None:
            if req.started:
                return False  # it runs elsewhere: that worker reports it
            self.on_finish(request_id, 0, "abort", now)  # a copy placed elsewhere that never started
        if not self.adopt(worker_id, request_id, tenant, prompt_tokens, max_tokens, output_tokens):
            return False
        self.on_finish(request_id, output_tokens, "stop", now)
        return True

    # ------------------------------------------------------------------ views

    def is_backlogged(self, tenant: str) -> bool:
        t = self.tenants.get(tenant)
        return t is not None and bool(t.queue)

    def next_in_line(self) -> Request | None:
        """The request the policy would dispatch next: what ``assign`` tries to place first."""
        top = self.tree.pick()
        return None if top is None else self.policy.next_request(top[1])

    def waiting_tenants(self) -> list[str]:
        """Tenants (leaves) with waiting requests."""
        if not self.tree.nodes and not self.tree.strict.kids:
            return list(self._waiting)
        return [t.name for t in self.tenants.values() if t.queue]

    def was_lost(self, request_id: str) -> bool:
        """Whether the request had started on a worker that left (it must not run a second time)."""
        return request_id in self._settled

    def is_queued(self, request_id: str) -> bool:
        return request_id in self._queued_ids

    def queue_depth(self) -> int:
        return len(self._queued_ids)

    def in_flight(self) -> dict[str, Request]:
        return self._in_flight

    def take_dropped(self) -> list[tuple[Request, str]]:
        """Requests removed from the queues because they can never fit (e.g. the big workers left)."""
        dropped, self.dropped = self.dropped, []
        return dropped

    def fits_now(self, prompt_tokens: int, max_tokens: int) -> bool:
        """Whether a request of this size would start at once (no one waiting, a worker has room)."""
        return not self.tree.any_waiting() and self.workers.place(_admission_need(prompt_tokens)) is not None

    def sibling_gaps(self) -> dict[str, float]:
        """Per tree node ("": the root), the largest counter gap between its backlogged children:
        siblings are what the bound compares (counters of different parents are not comparable)."""
        tree = self.tree
        gaps: dict[str, float] = {}
        for node in (tree.root, *tree.nodes.values()):
            entries = node.waiting.entries()  # type: ignore[union-attr]
            if len(entries) < 2:
                continue
            counters = [node.kids[name].counter for name, _ in entries]
            gaps[node.name] = max(counters) - min(counters)
        return gaps

    def fairness_bound(self) -> float:
        """The bound on the service gap between two backlogged tenants (weight 1) for the requests seen
        so far on the workers taking work now (the live page's): VTC's 2U (the policy's own, e.g.
        2U + Δ, where it states one) plus what the engines' queues can add."""
        active = [w for w in self.workers.slots.values() if not w.draining]
        pool = sum(w.kv_tokens for w in active)
        u = unit_u(self.cost, self.longest_prompt, self.longest_output, pool)
        stated = self.policy.bound(u)
        queued = self.config.max_engine_waiting * len(active)
        return (2.0 * u if stated is None else stated) + engine_queue_slack(self.cost, self.longest_prompt, queued)

    def demand(self) -> Demand:
        """Running and waiting load against the workers taking work (the autoscaler's input)."""
        slots = self.workers.slots.values()
        active = [w for w in slots if not w.draining]
        limits = [w.max_running for w in active if w.max_running]
        return Demand(
            queued_requests=len(self._queued_ids),
            queued_tokens=sum(t.queued_tokens for t in self.tenants.values() if t.queue),
            running_requests=len(self._in_flight),
            committed_tokens=sum(max(0, w.kv_tokens - w.free_tokens) + w.pending_tokens for w in slots),
            workers=len(active),
            pool_tokens=sum(w.kv_tokens for w in active) // len(active) if active else 0,
            max_running=min(limits) if limits else 0,
        )

    def stats(self) -> dict[str, Any]:
        return {
            "tenants": {
                t.name: {
                    "weight": t.weight,
                    "counter": t.counter,
                    "service": t.service,
                    "queued": len(t.queue),
                    "queued_tokens": t.queued_tokens,
                    "in_flight": t.in_flight,
                    "submitted": t.submitted,
                    "rejected": t.rejected,
                    "finished": t.finished,
                    "output_tokens": t.output_tokens,
                    "prompt_tokens": t.prompt_tokens,
                    "cached_tokens": t.cached_tokens,
                    "parent": t.parent,
                }
                for t in self.tenants.values()
            },
            "nodes": {
                n.name: {
                    "weight": n.weight,
                    "parent": n.parent,
                    "counter": n.counter,
                    "service": n.service,
                    "waiting": len(n.waiting) > 0,  # type: ignore[arg-type]
                    "implicit": n.implicit,
                }
                for n in self.tree.nodes.values()
            },
            "queue_depth": self.queue_depth(),
            "in_flight": len(self._in_flight),
            "workers": self.workers.snapshot(),
        }

    # --------------------------------------------------------------- snapshots

    def snapshot(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this scheduler is, as JSON-able data."""
        return snapshots.snapshot(self)

    @classmethod
    def from_snapshot(cls, data: Mapping[str, Any]) -> FairScheduler:
        return snapshots.from_snapshot(data)

    def durable_state(self) -> dict[str, Any]:
        """What a restarted dispatcher needs to continue fairly (``dispatcher.core.snapshots``)."""
        return snapshots.durable_state(self)

    def restore_durable(self, data: Mapping[str, Any]) -> None:
        """Continue from ``durable_state`` (on a fresh scheduler, before any request or worker)."""
        snapshots.restore_durable(self, data)

    def forget_settled(self) -> None:
        """Drop what was kept for re-announcements and re-submissions after a restart (once every
        worker and caller has had time to come back)."""
        self._settled.clear()
        self._resumed.clear()
        self.tree.resumed.clear()

    # --------------------------------------------------------------- internals

    def _footprint(self, req: Request) -> int:
        """The KV ``req`` is expected to reach: its prompt and its tenant's usual output."""
        guess = self.lengths.predict(req.tenant, req.max_tokens, None)  # 0: nothing known yet
        output = min(req.max_tokens, math.ceil(guess * FOOTPRINT_HEADROOM)) if guess else req.max_tokens
        return req.prompt_tokens + output

    def _own_node(self, t: Tenant) -> TreeNode:
        """The tenant's own node (its request classes), made on first use: it takes the tenant's place,
        weight and counter; the tenant, now its default class, is weighted as that class."""
        own = self._class_node(t)
        if own is not None:
            return own
        spec = self.classes.get(self.default_class)
        own = self.tree.split(t, spec.weight if spec is not None else 1.0)
        for req in self._in_flight.values():  # the node took over their charges: their refunds go there too
            if req.tenant == t.name:
                req.path = ((own.name, req.weight), *req.path)
        return own

    def _leaf_named(self, name: str) -> Tenant:
        """The leaf of that name, made as a tenant's class leaf when it names one (``tenant~class``)."""
        tenant, sep, klass = name.partition(CLASS_SEP)
        if sep and klass in self.classes:
            return self.class_leaf(tenant, klass)
        return self.add_tenant(name)

    def _queued_of(self, t: Tenant) -> int:
        """Requests waiting for ``t``'s key: all its fair classes together (a second class is no second cap)."""
        node = self.tree.nodes.get(t.parent)
        if node is None or not node.implicit:
            return len(t.queue)
        return sum(len(leaf.queue) for leaf in node.kids.values())  # type: ignore[union-attr]

    def _class_node(self, t: Tenant) -> TreeNode | None:
        node = self.tree.nodes.get(t.parent) if t.parent == t.name else None
        return node if node is not None and node.implicit else None

    def _key_if_waiting(self, t: Tenant) -> float | None:
        return self._key(t.name) if t.queue else None

    def _rekey_if_lower(self, t: Tenant, before: float | None) -> None:
        """The waiting set re-keys growing keys lazily; a key that went down must be pushed. Every event
        that may lower a tenant's key under some policy (a refund, a finished or lost request, a request
        put back at the head of the queue, a weight change) ends here."""
        if before is not None and t.queue:
            key = self._key(t.name)
            if key < before:
                self.tree.parent_of(t).waiting.push(t.name, key)  # type: ignore[union-attr]
        if t.ancestors:
            self.tree.rekey_ancestors(t)

    def _withdraw(self, request_id: str, seq: int | None) -> bool:
        """Remove a waiting request by id (and, when given, only the submission numbered ``seq``)."""
        tenant = self._queued_ids.get(request_id)
        if tenant is None:
            return False
        t = self.tenants[tenant]
        for req in t.queue:
            if req.id == request_id and (seq is None or req.seq == seq):
                self._take(t, req)
                return True
        return False

    def _unqueue(self, t: Tenant, req: Request) -> None:
        """Remove a waiting request from its tenant's queue (the waiting set is the caller's)."""
        if t.queue[0] is req:
            t.queue.popleft()
        else:
            t.queue.remove(req)
        t.queued_tokens -= req.prompt_tokens + req.max_tokens
        self._queued_ids.pop(req.id, None)

    def _take(self, t: Tenant, req: Request) -> None:
        """Remove a waiting request (withdrawn, dropped, or dispatched out of the policy's order). Its
        tenant's key may go down: a key read from the head (FCFS's arrival order) falls when the head
        leaves and a request put back ahead of earlier ones had been the head."""
        before = self._key(t.name) if len(t.queue) > 1 else None  # its last request: it leaves anyway
        self._unqueue(t, req)
        if not t.queue:
            self.tree.leave(t, at_top=False)
        else:
            self._rekey_if_lower(t, before)

    def _dispatch(self, t: Tenant, req: Request, slot: WorkerSlot, now: float, at_top: bool) -> Request:
        """Start ``req`` of ``t`` on ``slot``; ``at_top``: ``t`` is the waiting set's peek."""
        if at_top:  # its waiting set entry is updated below, in place: one heap operation
            self._unqueue(t, req)
        else:
            self._take(t, req)
        predicted = self.policy.predict(t, req)  # output charged ahead, with the prompt
        n_p = req.prompt_tokens
        self.ledger.account(t, (None, (n_p, 0)), (None, (n_p, predicted)) if predicted else None)
        req.predicted = req.charged_output = predicted
        req.weight = t.weight
        req.path = tuple((node.name, node.weight) for node in t.ancestors)  # where refunds go back to
        if req.prefix:
            expected = self.prefixes.expected_tokens(slot.id, req.prefix, req.block_tokens)
            req.cached = _cacheable(expected, n_p)
            self.ledger.account_cached(t, 0, req.cached, t.weight)
            self.prefixes.dispatched(slot.id, req.prefix, req.block_tokens)
        req.worker, req.dispatched_at = slot.id, now
        req.priority = round(PRIORITY_SCALE * t.in_flight / t.weight)  # its tenant's share of what runs
        req.beyond_room = not slot.starts_now(req.need)
        slot.beyond += req.beyond_room
        req.footprint = self._footprint(req)
        slot.expected += req.footprint
        slot.committed += req.need
        slot.pending_count += 1
        slot.pending_tokens += req.need
        slot.in_flight += 1
        t.in_flight += 1
        self._in_flight[req.id] = req
        if at_top:
            if t.queue:
                self.tree.parent_of(t).waiting.replace_top(t.name, self._key(t.name))  # type: ignore[union-attr]
            else:
                self.tree.leave(t, at_top=True)
        return req

    def _mark_started(self, req: Request, prompt_tokens: int, cached: int | None = None) -> None:
        req.started = True
        slot = self.workers.slots.get(req.worker or "")
        if cached is not None:
            self._correct_cached(req, _cacheable(cached, prompt_tokens))
        t = self.tenants[req.tenant]
        t.prompt_tokens += prompt_tokens
        t.cached_tokens += req.cached
        if slot is not None:
            slot.prompt_tokens += prompt_tokens
            slot.cached_tokens += req.cached
        if prompt_tokens != req.prompt_tokens:  # the engine's exact count replaces the estimate
            t = self.tenants[req.tenant]
            before = self._key_if_waiting(t)
            old, out, charged = req.prompt_tokens, req.output_tokens, req.charged_output
            move = ((old, out), (prompt_tokens, out)), ((old, charged), (prompt_tokens, charged))
            self.ledger.account(t, *move, req.weight, req.path)
            delta = prompt_tokens - old
            req.prompt_tokens = prompt_tokens
            req.need += delta
            if slot is not None:
                slot.committed += delta
                slot.pending_tokens += delta
            self._rekey_if_lower(t, before)
        if slot is not None:
            slot.pending_count -= 1
            slot.pending_tokens -= req.need
            slot.beyond -= req.beyond_room
        req.beyond_room = False

    def _correct_cached(self, req: Request, exact: int) -> None:
        """The engine's exact cached count replaces the expectation (in the charge and the index)."""
        if req.prefix and req.worker:
            self.prefixes.observed(req.worker, req.cached, exact)
        if exact != req.cached:
            t = self.tenants[req.tenant]
            before = self._key_if_waiting(t)
            self.ledger.account_cached(t, req.cached, exact, req.weight, req.path)
            req.cached = exact
            self._rekey_if_lower(t, before)

    def _release(self, req: Request) -> None:
        slot = self.workers.get(req.worker or "")
        if slot is None:
            return
        slot.committed -= req.need
        slot.expected -= req.footprint
        slot.in_flight -= 1
        if not req.started:
            slot.pending_count -= 1
            slot.pending_tokens -= req.need
            slot.beyond -= req.beyond_room
            req.beyond_room = False

    def _refund_dispatch(self, t: Tenant, req: Request) -> None:
        """Undo a dispatch that produced nothing: the request was never served (the caller re-keys)."""
        n_p = req.prompt_tokens
        self.ledger.account(t, ((n_p, 0), None), ((n_p, req.charged_output), None), req.weight, req.path)
        self.ledger.account_cached(t, req.cached, 0, req.weight, req.path)
        req.cached = 0

    def _settle_prediction(self, t: Tenant, req: Request) -> None:
        """A request that ends (or is lost) short of its prediction gets the unused part back, at the
        weight it was charged at (its dispatch)."""
        if req.charged_output > req.output_tokens:
            served = (req.prompt_tokens, req.output_tokens)
            charged = ((req.prompt_tokens, req.charged_output), served)
            self.ledger.account(t, (served, served), charged, req.weight, req.path)
            req.charged_output = req.output_tokens

    def _drop(self, t: Tenant, req: Request, reason: str) -> None:
        self._take(t, req)
        t.rejected += 1
        self.dropped.append((req, reason))

    def _local_pick(
        self, floor: float, top: Tenant, head: Request, parent: TreeNode
    ) -> tuple[Tenant, Request, WorkerSlot] | None:
        """Locality slack (DESIGN §2b): among the waiting tenants whose key is within the policy's
        slack of the smallest (at most ``LOCAL_TENANTS`` of them, in order; a tenant of weight w
        within Δ / w, so that the weighted bound holds for every pair), and among the first
        ``LOCAL_WINDOW`` requests of each, the request that finds the longest cached prefix on a
        worker that can start it now. A head request passed over ``MAX_PASSES`` times by later ones
        of its tenant goes first. Returns the pick (``head`` of ``top`` itself when no one gains
        over it), or None when ``head`` cannot start and no one else gains (the usual rules apply).
        In a tree, the tenants looked at are ``top``'s siblings (``parent``'s waiting leaves)."""
        place, expected = self.workers.place, self.prefixes.expected_tokens
        head_slot = place(head.need, head)
        head_gain = 0 if head_slot is None else expected(head_slot.id, head.prefix, head.block_tokens)
        if head_gain >= min(len(head.prefix) * head.block_tokens, head.prompt_tokens - 1):
            return None if head_slot is None else (top, head, head_slot)  # nothing can beat a full hit
        slack, key = self._slack, self._key
        best: tuple[int, Tenant, Request, WorkerSlot] | None = None
        kids = parent.kids
        for name in parent.waiting.smallest(LOCAL_TENANTS):  # type: ignore[union-attr]
            t = kids[name]
            if t is top or type(t) is TreeNode or key(name) > floor + slack / t.weight:
                continue  # entries below the top may hold stale keys: check each
            queue = t.queue
            window = 1 if queue[0].passed >= MAX_PASSES else LOCAL_WINDOW
            for i, req in enumerate(queue):
                if i >= window:
                    break
                if not req.prefix:
                    continue
                slot = place(req.need, req)
                if slot is None:
                    continue
                gain = expected(slot.id, req.prefix, req.block_tokens)
                if gain > head_gain and (best is None or gain > best[0]):  # a longer cached prefix, never none
                    best = (gain, t, req, slot)
        if best is None:
            return None if head_slot is None else (top, head, head_slot)
        _, t, req, slot = best
        if t.queue[0] is not req:
            t.queue[0].passed += 1
        return t, req, slot

    def _relaxed_pick(self, parent: TreeNode) -> tuple[Tenant, Request, WorkerSlot] | None:
        """Relaxed head-of-line: the first tenant in the policy's order whose next request fits (in a
        tree: among the siblings of the one that did not fit)."""
        for name in parent.waiting.smallest(self.config.relaxed_scan)[1:]:  # type: ignore[union-attr]
            t = parent.kids[name]
            if type(t) is TreeNode:
                continue
            req = self.policy.next_request(t)
            slot = self.workers.place(req.need, req)
            if slot is not None:
                return t, req, slot
        return None


def _admission_need(prompt_tokens: int) -> int:
    """KV tokens an engine must have free to admit a prompt: the prompt and its first output token."""
    return prompt_tokens + 1


def _cacheable(cached: int, prompt_tokens: int) -> int:
    """Cached tokens a prompt can have: the engine computes at least its last token."""
    return max(0, min(cached, prompt_tokens - 1))


def _optional(value: Any, kind: type) -> Any:
    return None if value is None else kind(value)
