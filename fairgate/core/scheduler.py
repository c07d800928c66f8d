"""The fair scheduler: per-tenant queues, the waiting set, the worker table, driven by a fairness policy.

This is the one implementation of dispatching (docs/architecture.md). It is pure: no I/O, no clock, no threads;
every event carries ``now``. The simulator, the Ray actor and the tests all drive it through the same
events: ``submit``, ``assign``, ``on_report``, ``on_finish``, ``cancel``, ``worker_join``,
``worker_drain``, ``worker_leave``, ``requeue``, ``adopt``. What is fair is the policy's to say
(``fairgate.core.policies``), where a request runs is the placement rule's
(``fairgate.core.placement``), and what it costs is the ledger's (``fairgate.core.ledger``); this
module takes requests in and decides where they go; its parts keep the rest: settings
(``scheduler_config``), tenants (``tenant_book``), what engines report and what finished requests
owe (``settlement``), failures (``recovery``), views and snapshots (``scheduler_views``), picks out of
the policy's order (``out_of_order``); snapshots are written in ``fairgate.core.snapshots``.
"""

from __future__ import annotations

import heapq
import math
from typing import NamedTuple

from fairgate.core.classes import default_class
from fairgate.core.continuations import Continuations
from fairgate.core.ledger import Ledger
from fairgate.core.model import Request, Tenant, start_need
from fairgate.core.objectives import ObjectiveEnforcement
from fairgate.core.openings import BudgetUse
from fairgate.core.out_of_order import OutOfOrderPicks
from fairgate.core.placement import make_placement
from fairgate.core.policies import FairnessPolicy, make_policy
from fairgate.core.predictors import MovingAveragePredictor
from fairgate.core.prefix_index import PrefixIndex
from fairgate.core.quotas import Amount, Prices, QuotaBook, Refusal
from fairgate.core.reasons import (
    REJECT_OBJECTIVE,
    REJECT_QUEUE_FULL,
    REJECT_QUOTA,
    REJECT_RATE_LIMITED,
    REJECT_TENANT_QUEUE_FULL,
    REJECT_TOO_LARGE,
)
from fairgate.core.recovery import WorkerRecovery
from fairgate.core.revocation import Revocation
from fairgate.core.scheduler_config import SchedulerConfig
from fairgate.core.scheduler_state import SchedulerState
from fairgate.core.scheduler_views import SchedulerViews
from fairgate.core.settlement import Settlement, cacheable
from fairgate.core.tenant_book import TenantBook
from fairgate.core.tree import CLASS_SEP, SPARE, TenantTree
from fairgate.core.wait_prediction import ObjectiveMiss, WaitPredictor
from fairgate.core.workers import WorkerSlot, WorkerTable

FOOTPRINT_HEADROOM = 1.5  # a footprint covers half as much again as the tenant's recent mean output
PRIORITY_SCALE = 100  # preemption ranks in hundredths of a request in flight per unit of weight
URGENT_PRIORITY = -1  # the rank of a request whose class enforces its first-token objective
SPARE_PRIORITY = 10**9  # the rank of a request served over its quota: preempted first


class Assignment(NamedTuple):
    """A decision: start ``request`` on worker ``worker_id`` now."""

    request: Request
    worker_id: str


class FairScheduler(
    TenantBook, Settlement, WorkerRecovery, Revocation, SchedulerViews, OutOfOrderPicks, ObjectiveEnforcement
):
    """Per-tenant queues and counters, the waiting set and the worker table, under one policy."""

    def __init__(
        self, config: SchedulerConfig | None = None, quotas: QuotaBook | None = None, prices: Prices | None = None
    ) -> None:
        self.config = config or SchedulerConfig()
        self.quotas = quotas or QuotaBook()  # token and money quotas, shared by every pool of a dispatcher
        self.prices = prices or Prices()  # this pool's model's, for money quotas
        self.last_refusal: Refusal | None = None  # the latest quota refusal (its answer says when to retry)
        self._drop_refusals: dict[str, Refusal] = {}  # requests a quota dropped at their turn, not yet taken
        self._taken_refusals: dict[str, Refusal] = {}  # those of the last take_dropped
        self.policy: FairnessPolicy = make_policy(self.config.policy, self.config.seed)
        self.cost = self.config.cost
        self.ledger = Ledger(self.cost)  # its nodes: the tree's, below
        self.prefixes = PrefixIndex()  # which prompt blocks each worker probably caches
        self.continuations = Continuations()  # waiting requests that extend dispatched ones (locality slack)
        placement = make_placement(self.config.placement)
        placement.attach(self.prefixes)
        self.workers = WorkerTable(placement, self.config.max_engine_waiting, self.config.overcommit)
        self.lengths = MovingAveragePredictor()  # what each tenant's requests generate: their footprints
        self.budget = BudgetUse()  # how much of their max_tokens they use: when running ones end
        self._slack = self.policy.locality_slack  # 0: the policy's order exactly
        self.state = SchedulerState()  # tenants, queued and in-flight requests: what recovery writes
        self._key = self.policy.key_function(self.tenants)
        self.tree = TenantTree(self.tenants, self._key, self.policy.rejoin)
        self.ledger.nodes = self.tree.nodes
        self._waiting = self.tree.root.waiting
        self.classes = {c.name: c for c in self.config.classes}
        self.default_class = default_class(self.config.classes)
        self.dropped: list[tuple[Request, str]] = []
        self.waits = WaitPredictor()  # first-token waits predicted and checked (objective classes)
        for c in self.config.classes:
            if c.ttft_s is not None:
                self.waits.add_class(c.name, c.ttft_s, c.on_miss)
        if any(c.enforced for c in self.config.classes):
            self.workers.reserve = self.config.objective_reserve
        self.urgent_waiting: dict[str, Tenant] = {}  # leaves that may hold urgent requests (pruned lazily)
        self.last_shed: ObjectiveMiss | None = None  # the latest request shed by its class (its answer says why)
        self.revoking: dict[str, str] = {}  # request id -> worker: asked to take it back, no answer yet

    @property
    def tenants(self) -> dict[str, Tenant]:
        return self.state.tenants

    @property
    def longest_prompt(self) -> int:
        """The longest prompt submitted so far (for the bound's U)."""
        return self.state.longest_prompt

    @property
    def longest_output(self) -> int:
        """The largest ``max_tokens`` submitted so far (for the bound's U)."""
        return self.state.longest_output

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
        adapter: str = "",
    ) -> str | None:
        """Queue a request. Returns None when accepted, else the reason it was rejected. ``resumed``: a
        request admitted before (its caller asks again after a dispatcher restart): the policy's
        admission (e.g. RPM's window) is not asked again. ``prefix``: the chained hashes of its prompt's
        blocks of ``block_tokens`` tokens (for cache-aware placement, order and cost). ``klass``: its
        request class ("": the default); the request's ``tenant`` is then its class's leaf. ``adapter``:
        the LoRA adapter it is served with ("": the base model; its prefix hashes are that adapter's)."""
        if request_id in self.state.in_flight or request_id in self.state.queued_ids:
            raise ValueError(f"duplicate request id {request_id!r}")
        if prompt_tokens < 0 or max_tokens < 1:
            raise ValueError("prompt_tokens must be >= 0 and max_tokens >= 1")
        leaf = self.class_leaf(tenant, klass)
        t, predicted_wait, shed = self._objective(tenant, klass, leaf, prompt_tokens, max_tokens, resumed, now)
        leaf.submitted += shed
        leaf.rejected += shed
        if shed:
            return REJECT_OBJECTIVE
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
        if config.max_queued is not None and len(self.state.queued_ids) >= config.max_queued:
            t.rejected += 1
            return REJECT_QUEUE_FULL
        if self.quotas and self._over_quota(t, self._most(prompt_tokens, max_tokens), now):
            if self.last_refusal.rule.over == "reject":
                t.rejected += 1
                return REJECT_QUOTA
            t = self.spare_leaf(self.quota_names(t)[0])  # served from what no one else wants
            tenant = t.name
        if not resumed and not self.policy.admit(t, now):  # last: a refusal for another reason uses no slot
            t.rejected += 1
            return REJECT_RATE_LIMITED
        need = start_need(prompt_tokens)
        req = Request(request_id, tenant, prompt_tokens, max_tokens, now, self.state.next_seq, need, true_output)
        req.predicted_wait = predicted_wait
        req.adapter = adapter
        req.urgent = self._enforced(t)
        if req.urgent:
            self.urgent_waiting[t.name] = t
        if prefix and block_tokens > 0:
            req.prefix, req.block_tokens = tuple(prefix), block_tokens
        self.state.next_seq += 1
        self.state.longest_prompt = max(self.state.longest_prompt, prompt_tokens)
        self.state.longest_output = max(self.state.longest_output, max_tokens)
        if not t.queue:
            lift = tenant not in self.state.resumed  # it was waiting when the dispatcher stopped: never idle
            self.state.resumed.discard(tenant)
            t.queue.append(req)
            self.tree.join(t, lift)
        else:
            t.queue.append(req)
        t.queued_tokens += prompt_tokens + max_tokens
        self.state.queued_ids[request_id] = tenant
        if req.prefix and self._slack > 0:
            req.home = self._home_of(req)
            self.continuations.wait(req)
        if config.max_queue_s is not None:
            heapq.heappush(self.state.arrivals, (now, req.seq, request_id))
        return None

    def assign(self, now: float) -> list[Assignment]:
        """Dispatch, in the policy's order, every request that can start now."""
        out: list[Assignment] = []
        self.waits.observe(now, self.ledger.total)
        if not self.workers.slots:
            return out
        self.workers.begin_pass()
        pick, place, has_slack = self.tree.pick, self.workers.place, self.workers.has_slack
        next_request = self.policy.next_request
        while True:
            top = pick()
            if top is None:
                break
            key, tenant, parent = top
            req = next_request(tenant)
            if not req.urgent and not has_slack():
                urgent = self._urgent_dispatch(now)  # the next request waits for the engines: an urgent one goes
                if urgent is None:
                    break
                out.append(Assignment(*urgent))
                continue
            if self.quotas and self._over_quota(tenant, self._most(req.prompt_tokens, req.max_tokens), now):
                # others of its quotas took what was left meanwhile (demoted already: a refusing one)
                if self.last_refusal.rule.over == "reject":
                    self._drop(tenant, req, REJECT_QUOTA)
                    self._drop_refusals[req.id] = self.last_refusal
                    continue
                if parent is not self.tree.spare:
                    self._demote(tenant, req)
                    continue
            if self._slack > 0 and req.prefix and self.prefixes.used:
                picked = self._local_pick(key, tenant, req, parent)
                if picked is not None:
                    picked_tenant, picked_req, slot = picked
                    at_top = picked_req is req
                    out.append(Assignment(self._dispatch(picked_tenant, picked_req, slot, now, at_top), slot.id))
                    continue
            slot = place(req.need, req)
            if slot is not None and self.config.revoke and not req.urgent and not slot.starts_now(req.need):
                slot = self.place_or_wait(tenant, req)
                if slot is None:
                    break  # it waits here: what it is owed is taken back (``revocations``)
            if parent is self.tree.spare and slot is not None and not slot.starts_now(req.need):
                break  # a demoted request never waits inside an engine ahead of one that comes later
            if slot is None:
                largest = self.workers.largest_pool
                if largest and req.prompt_tokens + req.max_tokens > largest:
                    self._drop(tenant, req, REJECT_TOO_LARGE)
                    continue
                urgent = self._urgent_dispatch(now)
                if urgent is not None:
                    out.append(Assignment(*urgent))
                    continue
                if req.adapter:
                    picked = self._adapter_pick(key, tenant, req, parent)
                    if picked is not None:
                        tenant, req, slot = picked
                        out.append(Assignment(self._dispatch(tenant, req, slot, now, at_top=False), slot.id))
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

    def _home_of(self, req: Request) -> str:
        """The worker expected to hold most of a new request's prefix ("": none holds any of it): an
        earlier turn it extends went there before it arrived."""
        expected, best, home = self.prefixes.expected_tokens, 0, ""
        for wid in self.workers.slots:
            found = expected(wid, req.prefix, req.block_tokens)
            if found > best:
                best, home = found, wid
        return home

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
        arrivals = self.state.arrivals
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
        max_loras: int | None = None,
    ) -> None:
        """A worker takes work: its KV pool, batch limit, free KV now, admission watermark (tokens) and
        the LoRA adapters its batch holds at once (None: it serves none)."""
        self.workers.join(worker_id, kv_tokens, max_running, free_tokens, watermark, max_loras)
        self.prefixes.join(worker_id, kv_tokens)

    def worker_drain(self, worker_id: str) -> None:
        """Stop assigning to a worker; what it runs finishes there."""
        self.workers.drain(worker_id)

    # --------------------------------------------------------------- internals

    def _footprint(self, req: Request) -> int:
        """The KV ``req`` is expected to reach: its prompt and its tenant's usual output, at least what
        its requests in flight already reached."""
        guess = self.lengths.predict(req.tenant, req.max_tokens, None)  # 0: nothing known yet
        output = min(req.max_tokens, math.ceil(guess * FOOTPRINT_HEADROOM)) if guess else req.max_tokens
        return req.prompt_tokens + min(req.max_tokens, max(output, self.tenants[req.tenant].outgrown))

    def quota_names(self, t: Tenant) -> list[str]:
        """The names quotas can be set on for ``t``'s requests (any class's, or demoted): its tenant's and
        its tree nodes' (a tenant with classes has a node of its own name: once)."""
        owner = self.tenants.get(t.name.partition(CLASS_SEP)[0], t)
        return list(dict.fromkeys([owner.name, *(node.name for node in owner.ancestors)]))

    def quota_path(self, name: str) -> list[str]:
        """A tenant or tree node and the nodes above it, nearest first (where its quota sits)."""
        t = self.tenants.get(name)
        if t is not None:
            return self.quota_names(t)
        path, node = [], self.tree.nodes.get(name)
        while node is not None:
            path.append(node.name)
            node = self.tree.nodes.get(node.parent)
        return path or [name]

    def _most(self, prompt_tokens: int, max_tokens: int) -> Amount:
        """The most a request may use: all its tokens, its prompt priced as if none of it were cached."""
        return Amount(prompt_tokens + max_tokens, self.prices.cost(prompt_tokens, 0, max_tokens))

    def _used(self, prompt_tokens: int, cached: int, output_tokens: int) -> Amount:
        return Amount(prompt_tokens + output_tokens, self.prices.cost(prompt_tokens, cached, output_tokens))

    def _over_quota(self, t: Tenant, most: Amount, now: float) -> bool:
        refusal = self.quotas.refusal(self.quota_names(t), most, now, self.quota_path)
        if refusal is not None:
            self.last_refusal = refusal
        return refusal is not None

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
        tenant = self.state.queued_ids.get(request_id)
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
        self.state.queued_ids.pop(req.id, None)
        if req.prefix and self._slack > 0:
            self.continuations.leave(req)

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
        counter_before = t.counter
        n_p = req.prompt_tokens
        self.ledger.account(t, (None, (n_p, 0)), (None, (n_p, predicted)) if predicted else None)
        req.predicted = req.charged_output = predicted
        req.weight = t.weight
        req.path = tuple((node.name, node.weight) for node in t.ancestors)  # where refunds go back to
        if req.prefix:
            expected = self.prefixes.expected_tokens(slot.id, req.prefix, req.block_tokens)
            req.cached = cacheable(expected, n_p)
            self.ledger.account_cached(t, 0, req.cached, t.weight)
            self.prefixes.dispatched(slot.id, req.prefix, req.block_tokens)
            if self._slack > 0:
                self.continuations.dispatched(req, slot.id)
        req.worker, req.dispatched_at = slot.id, now
        req.handed = self.state.next_seq
        self.state.next_seq += 1
        if self.config.revoke:
            self._hold(t, req, counter_before)
        if self.quotas:
            self.quotas.hold(req.id, self.quota_names(t), self._most(req.prompt_tokens, req.max_tokens), now)
        req.priority = round(PRIORITY_SCALE * t.in_flight / t.weight)  # its tenant's share of what runs
        if t.parent == SPARE:
            req.priority = SPARE_PRIORITY  # preempted before anyone within their quotas
        elif req.urgent:
            req.priority = URGENT_PRIORITY  # first among what waits in its engine, preempted last
        req.beyond_room = not slot.starts_now(req.need)
        slot.beyond += req.beyond_room
        req.footprint = self._footprint(req)
        slot.expected += req.footprint
        slot.committed += req.need
        slot.pending_count += 1
        slot.pending_tokens += req.need
        slot.in_flight += 1
        slot.hold_adapter(req.adapter)
        t.in_flight += 1
        self.waits.dispatched += 1
        self.state.in_flight[req.id] = req
        if at_top:
            if t.queue:
                self.tree.parent_of(t).waiting.replace_top(t.name, self._key(t.name))  # type: ignore[union-attr]
            else:
                self.tree.leave(t, at_top=True)
        return req

    def _demote(self, t: Tenant, req: Request) -> None:
        """Move a waiting request over a demoting quota to its tenant's spare leaf (the spare band)."""
        self._take(t, req)
        spare = self.spare_leaf(self.quota_names(t)[0])
        req.tenant = spare.name
        joins = not spare.queue
        spare.queue.append(req)
        if joins:
            self.tree.join(spare, True)
        spare.queued_tokens += req.prompt_tokens + req.max_tokens
        self.state.queued_ids[req.id] = spare.name

    def _drop(self, t: Tenant, req: Request, reason: str) -> None:
        self._take(t, req)
        t.rejected += 1
        self.dropped.append((req, reason))
