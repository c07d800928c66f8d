"""The fair scheduler: the events the gateway drives the core with, and the decisions they lead to.

This is the one implementation of dispatching (docs/architecture.md). It is pure: no I/O, no clock, no
threads; every event carries ``now``. The simulator, the Ray actor and the tests all drive it through
the same events: ``submit``, ``assign``, ``on_report``, ``on_finish``, ``cancel``, ``worker_join``,
``worker_drain``, ``worker_leave``, ``requeue``, ``adopt``. What is fair is the policy's to say
(``fairgate.core.policies``), where a request runs is the placement rule's (``fairgate.core.placement``).
The rest is kept by parts that own their data and are called here: the tenants and their tree
(``TenantBook``), what waits (``WaitingQueues``), what runs (``InFlight``), charges from dispatch to the
end (``Settlement``, through the ``Ledger``), quotas (``QuotaGate``), first-token objectives
(``Objectives``), revocation (``Revocation``), failures and restarts (``Recovery``), and the picks
outside the policy's order (``OutOfOrderPicks``). Each part snapshots itself, so a restored scheduler
has all of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from fairgate.core import scheduler_views, snapshots
from fairgate.core.capacity import Demand
from fairgate.core.in_flight import InFlight
from fairgate.core.ledger import Ledger
from fairgate.core.model import Request, Tenant, start_need
from fairgate.core.objectives import Objectives
from fairgate.core.openings import BudgetUse
from fairgate.core.out_of_order import OutOfOrderPicks
from fairgate.core.placement import make_placement
from fairgate.core.policies import FairnessPolicy, make_policy
from fairgate.core.predictors import MovingAveragePredictor
from fairgate.core.prefix_index import PrefixIndex
from fairgate.core.queues import WaitingQueues
from fairgate.core.quota_gate import QuotaGate
from fairgate.core.quotas import Prices, QuotaBook, Refusal
from fairgate.core.reasons import (
    FINISH_REVOKED,
    REJECT_OBJECTIVE,
    REJECT_QUEUE_FULL,
    REJECT_QUOTA,
    REJECT_RATE_LIMITED,
    REJECT_TENANT_QUEUE_FULL,
    REJECT_TOO_LARGE,
)
from fairgate.core.recovery import LeaveResult, Recovery
from fairgate.core.revocation import Revocation
from fairgate.core.scheduler_config import SchedulerConfig
from fairgate.core.settlement import Settlement
from fairgate.core.shards import Figures
from fairgate.core.tenant_book import TenantBook
from fairgate.core.threshold import ThresholdRule
from fairgate.core.tree import SPARE, TenantTree, TreeNode
from fairgate.core.wait_prediction import ObjectiveMiss, WaitPredictor
from fairgate.core.workers import WorkerSlot, WorkerTable

PRIORITY_SCALE = 100  # preemption ranks in hundredths of a request in flight per unit of weight
URGENT_PRIORITY = -1  # the rank of a request whose class enforces its first-token objective
SPARE_PRIORITY = 10**9  # the rank of a request served over its quota: preempted first


class Assignment(NamedTuple):
    """A decision: start ``request`` on worker ``worker_id`` now."""

    request: Request
    worker_id: str


class FairScheduler:
    """Per-tenant queues and counters, the waiting set and the worker table, under one policy."""

    def __init__(
        self, config: SchedulerConfig | None = None, quotas: QuotaBook | None = None, prices: Prices | None = None
    ) -> None:
        self.config = config = config or SchedulerConfig()
        self.policy: FairnessPolicy = make_policy(config.policy, config.seed)
        self.cost = config.cost
        self.prefixes = PrefixIndex()  # which prompt blocks each worker probably caches
        placement = make_placement(config.placement)
        placement.attach(self.prefixes)
        self.workers = WorkerTable(placement, config.max_engine_waiting, config.overcommit)
        self.flights = InFlight()
        self.book = TenantBook(self.policy, config.classes, self.flights)
        self.queues = WaitingQueues(self.book, self.policy.locality_slack > 0, config.max_queue_s is not None)
        self.gate = QuotaGate(quotas or QuotaBook(), prices or Prices(), self.book)
        lengths, budget = MovingAveragePredictor(), BudgetUse()
        self.objectives = Objectives(self.book, self.workers, self.cost, lengths)
        if self.objectives.enforcing:
            self.workers.reserve = config.objective_reserve
        self.revocation = Revocation(config.revoke, self.book, self.flights, self.workers, budget)
        self.threshold = ThresholdRule(config.threshold, self.book, self.flights)
        self.settlement = Settlement(
            Ledger(self.cost, self.book.tree.nodes),
            self.book,
            self.flights,
            self.workers,
            self.prefixes,
            self.revocation,
            self.objectives,
            self.gate,
            lengths,
            budget,
        )
        self.recovery = Recovery(
            self.book,
            self.queues,
            self.flights,
            self.settlement,
            self.revocation,
            self.objectives,
            self.gate,
            self.workers,
            self.prefixes,
        )
        # tenants another dispatcher shard holds waiting requests of (``fairgate.core.shards``): one
        # joining this shard's queue waited all along, and is not lifted
        self.waiting_elsewhere: frozenset[str] = frozenset()
        self.picks = OutOfOrderPicks(
            self.book, self.workers, self.prefixes, self.queues.continuations, self.flights, budget, config.relaxed_scan
        )

    # ------------------------------------------------------------------ parts' figures, by name

    @property
    def tenants(self) -> dict[str, Tenant]:
        return self.book.tenants

    @property
    def tree(self) -> TenantTree:
        return self.book.tree

    @property
    def ledger(self) -> Ledger:
        return self.settlement.ledger

    @property
    def lengths(self) -> MovingAveragePredictor:
        return self.settlement.lengths

    @property
    def quotas(self) -> QuotaBook:
        return self.gate.quotas

    @property
    def last_refusal(self) -> Refusal | None:
        """The latest quota refusal (its answer says when to retry)."""
        return self.gate.last_refusal

    @property
    def waits(self) -> WaitPredictor:
        return self.objectives.waits

    @property
    def last_shed(self) -> ObjectiveMiss | None:
        """The latest request shed by its class (its answer says why)."""
        return self.objectives.last_shed

    @property
    def longest_prompt(self) -> int:
        """The longest prompt submitted so far (for the bound's U)."""
        return self.flights.longest_prompt

    @property
    def longest_output(self) -> int:
        """The largest ``max_tokens`` submitted so far (for the bound's U)."""
        return self.flights.longest_output

    # ------------------------------------------------------------------ requests

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
        adapter: str = "",
    ) -> str | None:
        """Queue a request. Returns None when accepted, else the reason it was rejected. ``resumed``: a
        request admitted before (its caller asks again after a dispatcher restart): the policy's
        admission (e.g. RPM's window) is not asked again. ``prefix``: the chained hashes of its prompt's
        blocks of ``block_tokens`` tokens (for cache-aware placement, order and cost). ``klass``: its
        request class ("": the default); the request's ``tenant`` is then its class's leaf. ``adapter``:
        the LoRA adapter it is served with ("": the base model; its prefix hashes are that adapter's)."""
        if request_id in self.flights or request_id in self.queues:
            raise ValueError(f"duplicate request id {request_id!r}")
        if prompt_tokens < 0 or max_tokens < 1:
            raise ValueError("prompt_tokens must be >= 0 and max_tokens >= 1")
        leaf = self.book.class_leaf(tenant, klass)
        judged = self.objectives.judge(tenant, klass, leaf, prompt_tokens, max_tokens, resumed, now)
        t, predicted_wait, shed = judged
        leaf.submitted += shed
        leaf.rejected += shed
        if shed:
            return REJECT_OBJECTIVE
        t.submitted += 1
        refused = self._refused(t, prompt_tokens, max_tokens, now)
        if refused is not None:
            t.rejected += 1
            return refused
        if self.gate and (refusal := self.gate.over(t, prompt_tokens, max_tokens, now)) is not None:
            if refusal.rule.over == "reject":
                t.rejected += 1
                return REJECT_QUOTA
            t = self.book.spare_leaf(self.book.quota_names(t)[0])  # served from what no one else wants
        if not resumed and not self.policy.admit(t, now):  # last: a refusal for another reason uses no slot
            t.rejected += 1
            return REJECT_RATE_LIMITED
        flights = self.flights
        req = Request(request_id, t.name, prompt_tokens, max_tokens, now, flights.take_seq(), start_need(prompt_tokens))
        req.true_output, req.predicted_wait, req.adapter = true_output, predicted_wait, adapter
        req.urgent = self.objectives.is_urgent(t)
        if req.urgent:
            self.objectives.waiting(t)
        if prefix and block_tokens > 0:
            req.prefix, req.block_tokens = tuple(prefix), block_tokens
        flights.saw(prompt_tokens, max_tokens)
        if req.prefix and self.picks.slack > 0:
            req.home = self._home_of(req)
        lift = not t.queue and t.name not in self.waiting_elsewhere and self.recovery.lifts_on_return(t.name)
        self.queues.enqueue(t, req, lift=lift)
        return None

    def _refused(self, t: Tenant, prompt_tokens: int, max_tokens: int, now: float) -> str | None:
        """Why a request of this size may not queue for ``t`` now, by size and the queues' caps."""
        largest = self.workers.largest_pool
        if largest and prompt_tokens + max_tokens > largest:  # could it ever run alone: its full size
            return REJECT_TOO_LARGE
        config = self.config
        if config.max_queued_per_tenant is not None and self.book.queued_of(t) >= config.max_queued_per_tenant:
            return REJECT_TENANT_QUEUE_FULL
        if config.max_queued is not None and len(self.queues) >= config.max_queued:
            return REJECT_QUEUE_FULL
        return None

    def _home_of(self, req: Request) -> str:
        """The worker expected to hold most of a new request's prefix ("": none holds any of it): an
        earlier turn it extends went there before it arrived."""
        expected, best, home = self.prefixes.expected_tokens, 0, ""
        for wid in self.workers.slots:
            found = expected(wid, req.prefix, req.block_tokens)
            if found > best:
                best, home = found, wid
        return home

    def assign(self, now: float) -> list[Assignment]:
        """Dispatch, in the policy's order, every request that can start now."""
        out: list[Assignment] = []
        self.objectives.waits.observe(now, self.settlement.ledger.total)
        if not self.workers.slots or not self.queues:  # nothing can start: a pass costs nothing
            return out
        self.workers.begin_pass()
        pick, place, has_slack = self.book.tree.pick, self.workers.place, self.workers.has_slack
        next_request, picks = self.policy.next_request, self.picks
        while True:
            top = pick()
            if top is None:
                break
            key, tenant, parent = top
            req = next_request(tenant)
            if not req.urgent and not has_slack():
                if not self._dispatch_urgent(out, now):  # the next request waits for the engines: an urgent one goes
                    break
                continue
            if self.gate and (refusal := self.gate.over(tenant, req.prompt_tokens, req.max_tokens, now)) is not None:
                # others of its quotas took what was left meanwhile (demoted already: a refusing one)
                if refusal.rule.over == "reject":
                    self.queues.drop(tenant, req, REJECT_QUOTA)
                    self.gate.dropped(req.id, refusal)
                    continue
                if parent is not self.book.tree.spare:
                    self.queues.move(tenant, req, self.book.spare_leaf(self.book.quota_names(tenant)[0]))
                    continue
            if picks.slack > 0 and req.prefix and self.prefixes.used:
                local = picks.local_pick(key, tenant, req, parent)
                if local is not None:
                    self._dispatch_pick(out, local, now, at_top=local[1] is req)
                    continue
            slot = place(req.need, req)
            if slot is not None and self.revocation.enabled and not req.urgent and not slot.starts_now(req.need):
                slot = self.revocation.place_or_wait(tenant, req)
                if slot is None:
                    break  # it waits here: what it is owed is taken back (``revocations``)
            if parent is self.book.tree.spare and slot is not None and not slot.starts_now(req.need):
                break  # a demoted request never waits inside an engine ahead of one that comes later
            if slot is not None:
                self._dispatch_pick(out, (tenant, req, slot), now, at_top=True)
                continue
            largest = self.workers.largest_pool
            if largest and req.prompt_tokens + req.max_tokens > largest:
                self.queues.drop(tenant, req, REJECT_TOO_LARGE)
                continue
            if self._dispatch_urgent(out, now):
                continue
            other = picks.adapter_pick(key, tenant, req, parent) if req.adapter else None
            if other is None and not self.config.strict_head_of_line:
                other = picks.relaxed_pick(parent)
            if other is None:
                break
            self._dispatch_pick(out, other, now, at_top=False)
        return out

    def _dispatch_urgent(self, out: list[Assignment], now: float) -> bool:
        """Dispatch the urgent request that may go while the policy's next one waits, if any."""
        urgent = self.objectives.urgent_pick()
        if urgent is not None:
            self._dispatch_pick(out, urgent, now, at_top=False)
        return urgent is not None

    def _dispatch_pick(
        self, out: list[Assignment], pick: tuple[Tenant, Request, WorkerSlot], now: float, at_top: bool
    ) -> None:
        t, req, slot = pick
        out.append(Assignment(self._dispatch(t, req, slot, now, at_top), slot.id))

    def _dispatch(self, t: Tenant, req: Request, slot: WorkerSlot, now: float, at_top: bool) -> Request:
        """Start ``req`` of ``t`` on ``slot``; ``at_top``: ``t`` is the waiting set's peek."""
        queues = self.queues
        if at_top:  # its waiting set entry is updated below, in place: one heap operation
            queues.unqueue(t, req)
        else:
            queues.take(t, req)
        counter_before = self.settlement.charge_dispatch(t, req, slot)
        if req.prefix and self.picks.slack > 0:
            queues.continuations.dispatched(req, slot.id)
        req.worker, req.dispatched_at = slot.id, now
        req.handed = self.flights.take_seq()
        self.revocation.hold(t, req, counter_before)
        if self.gate:
            self.gate.hold(req, t, now)
        req.priority = round(PRIORITY_SCALE * t.in_flight / t.weight)  # its tenant's share of what runs
        if t.parent == SPARE:
            req.priority = SPARE_PRIORITY  # preempted before anyone within their quotas
        elif req.urgent:
            req.priority = URGENT_PRIORITY  # first among what waits in its engine, preempted last
        req.footprint = self.settlement.footprint(req)
        slot.assigned(req)
        t.in_flight += 1
        self.objectives.waits.dispatched += 1
        self.flights.add(req)
        if at_top:
            if t.queue:
                self.book.tree.parent_of(t).waiting.replace_top(t.name, self.book.key(t.name))
            else:
                self.book.tree.leave(t, at_top=True)
        return req

    def cancel(self, request_id: str) -> bool:
        """Withdraw a request still waiting in its queue (client gone). In-flight ones are aborted at
        their worker, whose finish event settles them."""
        return self.queues.withdraw(request_id)

    def expire(self, now: float) -> list[str]:
        """Withdraw the requests that have waited longer than ``max_queue_s`` since they arrived (one
        put back in its queue after a failed placement included); returns their ids."""
        limit = self.config.max_queue_s
        return [] if limit is None else self.queues.expire(now, limit)

    def take_dropped(self) -> list[tuple[Request, str]]:
        """Requests removed from the queues because they can never fit (e.g. the big workers left), or
        no longer fit a quota when their turn came (``dropped_refusal`` says which, until the next take)."""
        self.gate.take_dropped()
        return self.queues.take_dropped()

    def dropped_refusal(self, request_id: str) -> Refusal | None:
        """The quota refusal of a request the last ``take_dropped`` returned, if a quota dropped it."""
        return self.gate.dropped_refusal(request_id)

    # ------------------------------------------------------------------ engines' reports

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
        now: float | None = None,
        adapters: tuple[str, ...] | None = None,
        host_adapters: tuple[str, ...] | None = None,
        kv_events: Sequence[tuple[str, str, Sequence[int]]] | None = None,
    ) -> None:
        """One engine step of one worker: requests started (exact prompt tokens, and ``cached``: how
        many of them the engine found in its prefix cache) and tokens generated; ``now``: when it was
        received (first tokens are timed: objectives and their predictions); ``adapters``,
        ``host_adapters``: the LoRA adapters loaded on its GPU and in its host memory (None: unsaid);
        ``kv_events``: what its KV cache stored and evicted (``PrefixIndex.apply_events``)."""
        self.settlement.on_report(
            worker_id,
            new_tokens,
            started=started,
            free_tokens=free_tokens,
            running=running,
            waiting=waiting,
            cached=cached,
            now=now,
            adapters=adapters,
            host_adapters=host_adapters,
            kv_events=kv_events,
        )

    def on_finish(self, request_id: str, output_tokens: int, reason: str, now: float) -> Request | None:
        """A request ended on its worker: settle its charges and free its reservation. One its worker
        took back unstarted (``revoked``) waits again instead: None."""
        if reason == FINISH_REVOKED:  # it did not end: it waits again (or, started, it runs on)
            self.settle_revoked(request_id)
            return None
        return self.settlement.finish(request_id, output_tokens, now)

    # ------------------------------------------------------------------ workers

    def worker_join(
        self,
        worker_id: str,
        kv_tokens: int,
        max_running: int | None = None,
        free_tokens: int | None = None,
        watermark: int = 0,
        max_loras: int | None = None,
    ) -> None:
        """A worker takes work: its KV pool, batch limit, free KV now, admission watermark (tokens) and
        the LoRA adapters its batch holds at once (None: it serves none)."""
        self.workers.join(worker_id, kv_tokens, max_running, free_tokens, watermark, max_loras)
        self.prefixes.join(worker_id, kv_tokens)

    def worker_drain(self, worker_id: str) -> None:
        """Stop assigning to a worker; what it runs finishes there."""
        self.workers.drain(worker_id)

    def worker_leave(self, worker_id: str) -> LeaveResult:
        """A worker is gone (``Recovery.worker_leave``)."""
        return self.recovery.worker_leave(worker_id)

    def requeue(self, request_id: str) -> bool:
        """An assigned request that never started goes back to the head of its queue (``Recovery``)."""
        return self.recovery.requeue(request_id)

    def adopt(
        self,
        worker_id: str,
        request_id: str,
        tenant: str,
        prompt_tokens: int,
        max_tokens: int,
        output_tokens: int,
        now: float = 0.0,
        adapter: str = "",
    ) -> bool:
        """A worker announces a running request this scheduler does not track (``Recovery.adopt``)."""
        return self.recovery.adopt(
            worker_id, request_id, tenant, prompt_tokens, max_tokens, output_tokens, now, adapter
        )

    def settle_ended(
        self,
        worker_id: str,
        request_id: str,
        tenant: str,
        prompt_tokens: int,
        max_tokens: int,
        output_tokens: int,
        now: float,
        assigned_at: float | None = None,
    ) -> bool:
        """A worker says a request ended on it, in a hello after a break (``Recovery.settle_ended``)."""
        return self.recovery.settle_ended(
            worker_id, request_id, tenant, prompt_tokens, max_tokens, output_tokens, now, assigned_at
        )

    def forget_settled(self) -> None:
        """Drop what was kept for re-announcements once every worker and caller had time to come back."""
        self.recovery.forget_settled()

    # ------------------------------------------------------------------ revocation

    def revocations(self) -> list[tuple[str, str]]:
        """(request id, worker id) to take back now (``Revocation.revocations``)."""
        return self.revocation.revocations()

    def settle_revoked(self, request_id: str) -> bool:
        """Its worker took ``request_id`` back before its engine started it: it waits again at the head
        of its tenant's queue, its dispatch charge refunded. False when it is not in flight here or has
        started (a stray answer: it runs, nothing changes)."""
        return self.revocation.settle_revoked(request_id) and self.recovery.requeue(request_id)

    def revocation_answered(self, request_id: str, refused: bool = False) -> None:
        """``request_id`` is no longer out to be taken back (``refused``: its engine has begun it)."""
        self.revocation.answered(request_id, refused)

    def preemptions(self) -> list[tuple[str, str]]:
        """Running requests the threshold rule takes back now (``fairgate.core.threshold``): stop each on
        its worker; its end settles it, and its caller queues the rest of it again."""
        return self.threshold.preemptions()

    def preemption_answered(self, request_id: str) -> None:
        self.threshold.answered(request_id)

    def taking_back(self, request_id: str) -> bool:
        """Whether the threshold rule asked for this running request and has no answer yet."""
        return request_id in self.threshold.taking

    def place_or_wait(self, waiting: Tenant, req: Request) -> WorkerSlot | None:
        """Where ``req`` goes when its placement would queue it in an engine (``Revocation``)."""
        return self.revocation.place_or_wait(waiting, req)

    # ------------------------------------------------------------------ tenants and the tree

    def add_tenant(self, name: str, weight: float = 1.0, parent: str | None = None) -> Tenant:
        return self.book.add_tenant(name, weight, parent)

    def set_node(self, name: str, parent: str | None = None, weight: float | None = None) -> TreeNode:
        return self.book.set_node(name, parent, weight)

    def delete_node(self, name: str) -> None:
        self.book.delete_node(name)

    def class_leaf(self, tenant: str, klass: str = "") -> Tenant:
        return self.book.class_leaf(tenant, klass)

    def quota_names(self, t: Tenant) -> list[str]:
        return self.book.quota_names(t)

    # ------------------------------------------------------------------ shards (fairgate.core.shards)

    def member_figures(self) -> dict[str, Figures]:
        """Every tenant's and tree node's (service, counter, lifted), for a round of the shards."""
        return self.book.member_figures()

    def adopt_figures(self, figures: Mapping[str, Figures], waiting_elsewhere: Iterable[str]) -> None:
        """The fleet's figures after a round, and the tenants the other shards hold waiting requests of."""
        self.book.set_member_figures(figures)
        self.waiting_elsewhere = frozenset(waiting_elsewhere)

    def waiting_counts(self) -> dict[str, int]:
        """How many requests each waiting tenant has queued (a round deals them over the shards)."""
        return {t.name: len(t.queue) for t in self.book.tenants.values() if t.queue}

    def queued(self, tenant: str) -> list[Request]:
        """A tenant's waiting requests, in its queue's order (the newest last)."""
        t = self.book.tenants.get(tenant)
        return [] if t is None else list(t.queue)

    def hand_over(self, request_id: str) -> Request | None:
        """Withdraw a waiting request for another shard to queue (None: it no longer waits here)."""
        return self.queues.withdrawn(request_id)

    # ------------------------------------------------------------------ views

    def is_backlogged(self, tenant: str) -> bool:
        t = self.book.tenants.get(tenant)
        return t is not None and bool(t.queue)

    def next_in_line(self) -> Request | None:
        """The request the policy would dispatch next: what ``assign`` tries to place first."""
        top = self.book.tree.pick()
        return None if top is None else self.policy.next_request(top[1])

    def waiting_tenants(self) -> list[str]:
        """Tenants (leaves) with waiting requests."""
        return scheduler_views.waiting_tenants(self.book)

    def was_lost(self, request_id: str) -> bool:
        """Whether the request had started on a worker that left (it must not run a second time)."""
        return self.recovery.was_lost(request_id)

    def is_queued(self, request_id: str) -> bool:
        return request_id in self.queues

    def queue_depth(self) -> int:
        return len(self.queues)

    def in_flight(self) -> Mapping[str, Request]:
        return self.flights.by_id()

    def started_ids(self) -> list[str]:
        """Requests that ran and may still be announced: started and in flight, or lost with a worker."""
        return self.flights.started_ids() + list(self.recovery.settled)

    def fits_now(self, prompt_tokens: int, max_tokens: int) -> bool:
        """Whether a request of this size would start at once (no one waiting, a worker has room)."""
        return not self.book.tree.any_waiting() and self.workers.place(start_need(prompt_tokens)) is not None

    def sibling_gaps(self) -> dict[str, float]:
        """Per tree node ("": the root), the largest counter gap between its backlogged children."""
        return scheduler_views.sibling_gaps(self.book.tree)

    def fairness_bound(self) -> float:
        """The bound on the service gap between two backlogged tenants (weight 1) for the requests seen
        so far on the workers taking work now (the live page's)."""
        active = self.workers.taking_work
        return self.bound_for(self.longest_prompt, self.longest_output, sum(w.kv_tokens for w in active), len(active))

    def bound_for(self, longest_prompt: int, longest_output: int, pool: int, engines: int) -> float:
        """The stated bound for requests of these sizes on ``engines`` engines of ``pool`` KV tokens in
        all: the policy's own (2U + Δ with locality slack), else VTC's 2U, plus the engines' queues."""
        return scheduler_views.bound_for(self.policy, self.config, longest_prompt, longest_output, pool, engines)

    def demand(self) -> Demand:
        """Running and waiting load against the workers taking work (the autoscaler's input)."""
        return scheduler_views.demand(self.book, len(self.queues), len(self.flights), self.workers)

    def stats(self) -> dict[str, Any]:
        return scheduler_views.stats(self.book, len(self.queues), len(self.flights), self.workers)

    def tenant_stats(self) -> dict[str, Any]:
        return scheduler_views.tenant_stats(self.book)

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this scheduler is, as JSON-able data: each part's
        own snapshot."""
        return snapshots.snapshot(self.config, self._parts())

    @classmethod
    def from_snapshot(cls, data: Mapping[str, Any]) -> FairScheduler:
        """A scheduler that continues exactly where ``snapshot`` was taken."""
        s = cls(snapshots.config_of(data))
        snapshots.restore(s._parts(), data)
        return s

    def _parts(self) -> dict[str, snapshots.Part]:
        """Every part with state, in the order a snapshot restores them (the book before the parts that
        hold its tenants and queued requests)."""
        return {
            "in_flight": self.flights,
            "book": self.book,
            "queues": self.queues,
            "workers": self.workers,
            "policy": self.policy,
            "prefixes": self.prefixes,
            "settlement": self.settlement,
            "revocation": self.revocation,
            "threshold": self.threshold,
            "objectives": self.objectives,
            "quotas": self.gate,
            "recovery": self.recovery,
        }

    def durable_state(self, saved_at: float | None = None) -> dict[str, Any]:
        """What a restarted dispatcher needs to continue fairly (``fairgate.core.snapshots``)."""
        return snapshots.durable_state(self.book, self.flights, self.recovery, self.settlement, saved_at)

    def restore_durable(self, data: Mapping[str, Any], now: float | None = None) -> None:
        """Continue from ``durable_state`` (on a fresh scheduler, before any request or worker)."""
        if len(self.flights) or len(self.queues):
            raise ValueError("restore_durable needs a scheduler with nothing queued or in flight")
        snapshots.restore_durable(self.book, self.flights, self.recovery, self.settlement, data, now)
