"""The fair scheduler: VTC (and the baselines) over per-tenant queues and a table of workers.

This is the one implementation of the algorithm (DESIGN §1). It is pure: no I/O, no clock, no threads;
every event carries ``now``. The simulator, the Ray actor and the tests all drive it through the same
events: ``submit``, ``assign``, ``on_report``, ``on_finish``, ``cancel``, ``worker_join``,
``worker_drain``, ``worker_leave``, ``snapshot`` / ``from_snapshot``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from dispatcher.core.capacity import Demand
from dispatcher.core.costs import CostFunction, LinearCost, cost_from_spec
from dispatcher.core.model import Request, Tenant
from dispatcher.core.policies import Policy, parse_policy
from dispatcher.core.predictors import NoPredictor
from dispatcher.core.waiting import WaitingSet
from dispatcher.core.workers import WorkerSlot, WorkerTable

REJECT_RATE_LIMITED = "rate_limited"
REJECT_TOO_LARGE = "too_large"
REJECT_TENANT_QUEUE_FULL = "tenant_queue_full"
REJECT_QUEUE_FULL = "queue_full"
REJECT_QUEUE_TIMEOUT = "queue_timeout"
FINISH_WORKER_LOST = "worker_lost"
SNAPSHOT_VERSION = 1


@dataclass(frozen=True)
class SchedulerConfig:
    """Knobs of the scheduler; the fairness policy itself is ``policy``.

    ``strict_head_of_line``: when the least-served tenant's oldest request fits nowhere, stop (True,
    the default) or try up to ``relaxed_scan`` further tenants in counter order.
    ``output_reserve_cap``: KV tokens reserved for output per request; None reserves the full
    ``max_tokens`` (no engine preemption can happen), a number caps the reserve.
    ``max_engine_waiting``: at most this many requests assigned to a worker but not yet running.
    ``max_queued_per_tenant`` / ``max_queued``: caps on requests waiting (one tenant's / everyone's);
    ``max_queue_s``: a request still waiting after this long is withdrawn (``expire``). None: no limit.
    """

    policy: Policy = field(default_factory=lambda: Policy("vtc"))
    cost: CostFunction = field(default_factory=LinearCost)
    strict_head_of_line: bool = True
    relaxed_scan: int = 16
    output_reserve_cap: int | None = None
    max_engine_waiting: int = 8
    seed: int = 0
    max_queued_per_tenant: int | None = None
    max_queued: int | None = None
    max_queue_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k not in ("policy", "cost")}
        data["policy"] = asdict(self.policy)
        data["cost"] = self.cost.spec()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SchedulerConfig:
        policy = data.get("policy", "vtc")
        return cls(
            policy=parse_policy(policy) if isinstance(policy, str) else Policy(**policy),
            cost=cost_from_spec(data.get("cost")),
            strict_head_of_line=bool(data.get("strict_head_of_line", True)),
            relaxed_scan=int(data.get("relaxed_scan", 16)),
            output_reserve_cap=data.get("output_reserve_cap"),
            max_engine_waiting=int(data.get("max_engine_waiting", 8)),
            seed=int(data.get("seed", 0)),
            max_queued_per_tenant=_optional(data.get("max_queued_per_tenant"), int),
            max_queued=_optional(data.get("max_queued"), int),
            max_queue_s=_optional(data.get("max_queue_s"), float),
        )


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
    """Per-tenant queues and counters, the waiting set, the worker table and the charging rules."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.policy = self.config.policy
        self.cost = self.config.cost
        self.predictor = self.policy.make_predictor(self.config.seed)
        self._predict = None if isinstance(self.predictor, NoPredictor) else self.predictor.predict
        self.workers = WorkerTable(self.config.max_engine_waiting)
        self.tenants: dict[str, Tenant] = {}
        self._by_counter = self.policy.order == "counter"
        tenants = self.tenants
        self._waiting = WaitingSet(
            (lambda name: tenants[name].counter) if self._by_counter else (lambda name: tenants[name].queue[0].seq)
        )
        self._in_flight: dict[str, Request] = {}
        self._queued_ids: dict[str, str] = {}  # queued request id -> its tenant
        self._arrivals: deque[tuple[float, str]] = deque()  # (arrival, id), kept only with max_queue_s
        self._last_left: str | None = None
        self._next_seq = 0
        self._settled: dict[str, tuple[int, int, int]] = {}  # id -> (prompt, output, charged output)
        self.dropped: list[tuple[Request, str]] = []

    # ----------------------------------------------------------------- tenants

    def add_tenant(self, name: str, weight: float = 1.0) -> Tenant:
        """Register a tenant (or change its weight); takes effect on the next dispatch."""
        if weight <= 0:
            raise ValueError(f"tenant {name!r}: weight must be positive, got {weight}")
        tenant = self.tenants.get(name)
        if tenant is None:
            tenant = self.tenants[name] = Tenant(name, float(weight))
        else:
            tenant.weight = float(weight)
        return tenant

    # ------------------------------------------------------------------ events

    def submit(
        self,
        request_id: str,
        tenant: str,
        prompt_tokens: int,
        max_tokens: int,
        now: float,
        true_output: int | None = None,
    ) -> str | None:
        """Queue a request. Returns None when accepted, else the reason it was rejected."""
        if request_id in self._in_flight or request_id in self._queued_ids:
            raise ValueError(f"duplicate request id {request_id!r}")
        if prompt_tokens < 0 or max_tokens < 1:
            raise ValueError("prompt_tokens must be >= 0 and max_tokens >= 1")
        t = self.tenants.get(tenant) or self.add_tenant(tenant)
        t.submitted += 1
        cap = self.config.output_reserve_cap
        need = prompt_tokens + (max_tokens if cap is None or cap > max_tokens else cap)
        largest = self.workers._largest
        if largest and need > largest:
            t.rejected += 1
            return REJECT_TOO_LARGE
        if self.policy.rpm_limit is not None and not self._admit_rate(t, now):
            t.rejected += 1
            return REJECT_RATE_LIMITED
        config = self.config
        if config.max_queued_per_tenant is not None and len(t.queue) >= config.max_queued_per_tenant:
            t.rejected += 1
            return REJECT_TENANT_QUEUE_FULL
        if config.max_queued is not None and len(self._queued_ids) >= config.max_queued:
            t.rejected += 1
            return REJECT_QUEUE_FULL
        req = Request(request_id, tenant, prompt_tokens, max_tokens, now, self._next_seq, need, true_output)
        self._next_seq += 1
        if not t.queue:
            self._rejoin(t)
            t.queue.append(req)
            self._waiting.push(tenant, self._key(t))
        else:
            t.queue.append(req)
        t.queued_tokens += prompt_tokens + max_tokens
        self._queued_ids[request_id] = tenant
        if config.max_queue_s is not None:
            self._arrivals.append((now, request_id))
        return None

    def assign(self, now: float) -> list[Assignment]:
        """Dispatch, least-served tenant first, every request that can start now."""
        out: list[Assignment] = []
        if not self.workers.slots:
            return out
        waiting, tenants, place, has_slack = self._waiting, self.tenants, self.workers.place, self.workers.has_slack
        while has_slack():
            top = waiting.peek()
            if top is None:
                break
            tenant = tenants[top[1]]
            req = tenant.queue[0]
            slot = place(req.need)
            if slot is None:
                largest = self.workers.largest_pool()
                if largest and req.need > largest:
                    self._drop_head(tenant, REJECT_TOO_LARGE)
                    continue
                if self.config.strict_head_of_line:
                    break
                picked = self._relaxed_pick()
                if picked is None:
                    break
                tenant, slot = picked
                out.append(Assignment(self._dispatch(tenant, slot, now, at_top=False), slot.id))
                continue
            out.append(Assignment(self._dispatch(tenant, slot, now, at_top=True), slot.id))
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
    ) -> None:
        """One engine step of one worker: requests started (exact prompt tokens) and tokens generated."""
        in_flight = self._in_flight
        lowered: list[Tenant] = []
        if started:
            for rid, prompt_tokens in started.items():
                req = in_flight.get(rid)
                if req is not None and not req.started:
                    self._mark_started(req, prompt_tokens, lowered)
        total = self.cost.total
        tenants = self.tenants
        for rid, k in new_tokens.items():
            req = in_flight.get(rid)
            if req is None or k <= 0:
                continue
            if not req.started:
                self._mark_started(req, req.prompt_tokens, lowered)
            t = tenants[req.tenant]
            t.output_tokens += k
            old = req.output_tokens
            new = old + k
            n_p = req.prompt_tokens
            cost_new = total(n_p, new)
            cost_old = total(n_p, old)
            t.service += cost_new - cost_old
            req.output_tokens = new
            charged = req.charged_output
            if new > charged:
                if charged != old:
                    cost_old = total(n_p, charged)
                t.counter += (cost_new - cost_old) / t.weight
                req.charged_output = new
        slot = self.workers.slots.get(worker_id)
        if slot is not None:
            if free_tokens is not None:
                slot.free_tokens = free_tokens
            if running is not None:
                slot.running = running
            if waiting is not None:
                slot.waiting = waiting
        for t in lowered:  # increases are picked up lazily by the waiting set; decreases must be pushed
            if t.queue:
                self._waiting.push(t.name, self._key(t))

    def on_finish(self, request_id: str, output_tokens: int, reason: str, now: float) -> Request | None:
        """A request ended on its worker: settle its charges and free its reservation."""
        req = self._in_flight.get(request_id)
        if req is None:
            return None
        if output_tokens > req.output_tokens:
            self.on_report(req.worker or "", {request_id: output_tokens - req.output_tokens})
        del self._in_flight[request_id]
        t = self.tenants[req.tenant]
        if not req.started and req.output_tokens == 0:
            self._refund_dispatch(t, req)
        elif req.charged_output > req.output_tokens:
            n_p = req.prompt_tokens
            refund = self.cost.total(n_p, req.charged_output) - self.cost.total(n_p, req.output_tokens)
            t.counter -= refund / t.weight
            req.charged_output = req.output_tokens
            if self._by_counter and t.queue:
                self._waiting.push(t.name, t.counter)
        self._release(req)
        t.in_flight -= 1
        t.finished += 1
        if reason in ("stop", "length"):
            self.predictor.observe(req.tenant, req.output_tokens)
        return req

    def cancel(self, request_id: str) -> bool:
        """Withdraw a request still waiting in its queue (client gone). In-flight ones are aborted at
        their worker, whose finish event settles them."""
        tenant = self._queued_ids.get(request_id)
        if tenant is None:
            return False
        t = self.tenants[tenant]
        for req in t.queue:
            if req.id == request_id:
                was_head = t.queue[0] is req
                t.queue.remove(req)
                t.queued_tokens -= req.prompt_tokens + req.max_tokens
                del self._queued_ids[request_id]
                self._after_queue_change(t, was_head)
                return True
        return False

    def expire(self, now: float) -> list[str]:
        """Withdraw the requests that have waited longer than ``max_queue_s``; returns their ids.
        Each tenant's queue is in arrival order, so an expiring request is at its queue's head."""
        limit = self.config.max_queue_s
        if limit is None:
            return []
        expired: list[str] = []
        arrivals = self._arrivals
        while arrivals and arrivals[0][0] <= now - limit:
            _, request_id = arrivals.popleft()
            if self.cancel(request_id):
                expired.append(request_id)
        return expired

    def worker_join(
        self, worker_id: str, kv_tokens: int, max_running: int | None = None, free_tokens: int | None = None
    ) -> None:
        self.workers.join(worker_id, kv_tokens, max_running, free_tokens)

    def worker_drain(self, worker_id: str) -> None:
        """Stop assigning to a worker; what it runs finishes there."""
        self.workers.drain(worker_id)

    def worker_leave(self, worker_id: str) -> LeaveResult:
        """A worker is gone. Requests it had not started go back to the head of their queues, their
        dispatch charge refunded; requests that had started end as lost (what they were charged is kept,
        so that the worker re-announcing them after a broken stream charges only what is new)."""
        self.workers.leave(worker_id)
        mine = sorted((r for r in self._in_flight.values() if r.worker == worker_id), key=lambda r: -r.seq)
        requeued: list[str] = []
        lost: list[str] = []
        for req in mine:
            if not req.started:
                self.requeue(req.id)
                requeued.append(req.id)
                continue
            t = self.tenants[req.tenant]
            del self._in_flight[req.id]
            t.in_flight -= 1
            t.finished += 1
            self._settled[req.id] = (req.prompt_tokens, req.output_tokens, req.charged_output)
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
        del self._in_flight[request_id]
        t.in_flight -= 1
        self._release(req)
        self._refund_dispatch(t, req)
        req.worker, req.dispatched_at, req.predicted, req.charged_output = None, None, 0, 0
        if not t.queue:
            t.queue.appendleft(req)
            self._waiting.push(t.name, self._key(t))
        else:
            t.queue.appendleft(req)
            if not self._by_counter:
                self._waiting.push(t.name, self._key(t))
        t.queued_tokens += req.prompt_tokens + req.max_tokens
        self._queued_ids[req.id] = t.name
        return True

    def adopt(
        self, worker_id: str, request_id: str, tenant: str, prompt_tokens: int, max_tokens: int, output_tokens: int
    ) -> bool:
        """A worker announces a running request this scheduler does not track (after a dispatcher
        restart, or a worker's stream that broke). It is taken into the tables and charged what it has
        consumed beyond what was charged for it before (``restore_durable`` / ``worker_leave``)."""
        slot = self.workers.get(worker_id)
        if slot is None or request_id in self._in_flight:
            return False
        if request_id in self._queued_ids:  # a copy re-queued meanwhile: the original runs
            self.cancel(request_id)
        t = self.tenants.get(tenant) or self.add_tenant(tenant)
        total = self.cost.total
        before_p, before_out, before_charged = self._settled.pop(request_id, (0, 0, 0))
        if before_p or before_out or before_charged:
            served_before = total(before_p, before_out)
            charged_before = total(before_p, before_charged)
        else:
            served_before = charged_before = 0.0
        charged = max(output_tokens, before_charged)
        t.service += total(prompt_tokens, output_tokens) - served_before
        t.counter += (total(prompt_tokens, charged) - charged_before) / t.weight
        t.output_tokens += max(0, output_tokens - before_out)
        need = self._need(prompt_tokens, max(max_tokens, output_tokens, 1))
        req = Request(request_id, tenant, prompt_tokens, max(max_tokens, output_tokens, 1), 0.0, self._next_seq, need)
        self._next_seq += 1
        req.worker, req.started = worker_id, True
        req.output_tokens, req.charged_output = output_tokens, charged
        slot.committed += need
        slot.in_flight += 1
        t.in_flight += 1
        self._in_flight[request_id] = req
        if self._by_counter and t.queue:
            self._waiting.push(t.name, t.counter)
        return True

    # ------------------------------------------------------------------ views

    def is_backlogged(self, tenant: str) -> bool:
        return tenant in self._waiting

    def waiting_tenants(self) -> list[str]:
        return list(self._waiting)

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
        return not self._waiting and self.workers.place(self._need(prompt_tokens, max_tokens)) is not None

    def demand(self) -> Demand:
        """Running and waiting load against the workers taking work (the autoscaler's input)."""
        slots = self.workers.slots.values()
        active = [w for w in slots if not w.draining]
        limits = [w.max_running for w in active if w.max_running]
        return Demand(
            queued_requests=len(self._queued_ids),
            queued_tokens=sum(t.queued_tokens for t in self.tenants.values() if t.queue),
            running_requests=len(self._in_flight),
            committed_tokens=sum(w.committed for w in slots),
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
                }
                for t in self.tenants.values()
            },
            "queue_depth": self.queue_depth(),
            "in_flight": len(self._in_flight),
            "workers": self.workers.snapshot(),
        }

    # --------------------------------------------------------------- snapshots

    def snapshot(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this scheduler is, as JSON-able data."""
        return {
            "version": SNAPSHOT_VERSION,
            "config": self.config.to_dict(),
            "tenants": [t.state() for t in self.tenants.values()],
            "in_flight": [r.to_dict() for r in self._in_flight.values()],
            "waiting": [[name, tie] for name, tie in self._waiting.entries()],
            "next_tie": self._waiting.next_tie,
            "next_seq": self._next_seq,
            "last_left": self._last_left,
            "workers": self.workers.snapshot(),
            "predictor": self.predictor.snapshot(),
            "settled": [[rid, *row] for rid, row in self._settled.items()],
        }

    def durable_state(self) -> dict[str, Any]:
        """What a restarted dispatcher needs to continue fairly (counters, last-left tenant, predictor,
        and what each running request was charged), without the queues and workers: after a restart
        queued requests come back from their callers and running ones from their workers (``adopt``)."""
        tenants = {
            t.name: {k: v for k, v in t.state().items() if k not in ("queue", "in_flight", "admitted_at")}
            for t in self.tenants.values()
        }
        total = self.cost.total
        for r in self._in_flight.values():
            if not r.started:  # counted as if refunded: it starts later (adopted) or is submitted again
                row = tenants[r.tenant]
                row["service"] -= total(r.prompt_tokens, 0)
                row["counter"] -= total(r.prompt_tokens, r.charged_output) / row["weight"]
        return {
            "version": SNAPSHOT_VERSION,
            "tenants": list(tenants.values()),
            "charged": [
                [r.id, r.prompt_tokens, r.output_tokens, r.charged_output]
                for r in self._in_flight.values()
                if r.started
            ]
            + [[rid, *row] for rid, row in self._settled.items()],
            "next_seq": self._next_seq,
            "last_left": self._last_left,
            "predictor": self.predictor.snapshot(),
        }

    def restore_durable(self, data: Mapping[str, Any]) -> None:
        """Continue from ``durable_state`` (on a fresh scheduler, before any request or worker)."""
        if data.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported state version {data.get('version')!r}")
        if self._in_flight or self._queued_ids:
            raise ValueError("restore_durable needs a scheduler with nothing queued or in flight")
        for row in data["tenants"]:
            t = Tenant.from_state({**row, "queue": [], "in_flight": 0, "admitted_at": None})
            self.tenants[t.name] = t
        self._settled = {rid: (int(p), int(out), int(charged)) for rid, p, out, charged in data["charged"]}
        self._next_seq = int(data["next_seq"])
        last = data["last_left"]
        self._last_left = last if last in self.tenants else None
        self.predictor.restore(data["predictor"])

    def forget_settled(self) -> None:
        """Drop what was kept for re-announcements (once every worker has had time to re-attach)."""
        self._settled.clear()

    @classmethod
    def from_snapshot(cls, data: Mapping[str, Any]) -> FairScheduler:
        if data.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported snapshot version {data.get('version')!r}")
        sched = cls(SchedulerConfig.from_dict(data["config"]))
        for row in data["tenants"]:
            t = Tenant.from_state(row)
            sched.tenants[t.name] = t
            sched._queued_ids.update((r.id, t.name) for r in t.queue)
        sched._in_flight = {r["id"]: Request(**r) for r in data["in_flight"]}
        sched._waiting.load([(name, int(tie)) for name, tie in data["waiting"]], int(data["next_tie"]))
        sched._next_seq = int(data["next_seq"])
        sched._last_left = data["last_left"]
        sched.workers.restore(data["workers"])
        sched.predictor.restore(data["predictor"])
        sched._settled = {rid: (int(p), int(o), int(c)) for rid, p, o, c in data.get("settled", [])}
        if sched.config.max_queue_s is not None:
            queued = sorted((r.arrival, r.id) for t in sched.tenants.values() for r in t.queue)
            sched._arrivals.extend(queued)
        return sched

    # --------------------------------------------------------------- internals

    def _need(self, prompt_tokens: int, max_tokens: int) -> int:
        cap = self.config.output_reserve_cap
        return prompt_tokens + (max_tokens if cap is None else min(max_tokens, cap))

    def _key(self, t: Tenant) -> float:
        return t.counter if self._by_counter else t.queue[0].seq

    def _rejoin(self, t: Tenant) -> None:
        """VTC's lift: a tenant re-joining the waiting set keeps no idle credit (DESIGN §1)."""
        if not self.policy.lift:
            return
        top = self._waiting.peek()
        if top is not None:
            floor = self.tenants[top[1]].counter
        elif self._last_left is not None:
            floor = self.tenants[self._last_left].counter
        else:
            return
        if floor > t.counter:
            t.lifted += floor - t.counter
            t.counter = floor

    def _admit_rate(self, t: Tenant, now: float) -> bool:
        window = t.admitted_at
        if window is None:
            window = t.admitted_at = deque()
        horizon = now - self.policy.rpm_window_s
        while window and window[0] <= horizon:
            window.popleft()
        if len(window) >= (self.policy.rpm_limit or 0):
            return False
        window.append(now)
        return True

    def _dispatch(self, t: Tenant, slot: WorkerSlot, now: float, at_top: bool) -> Request:
        """Start ``t``'s oldest request on ``slot``; ``at_top``: ``t`` is the waiting set's peek."""
        req = t.queue.popleft()
        self._queued_ids.pop(req.id, None)
        n_p = req.prompt_tokens
        t.queued_tokens -= n_p + req.max_tokens
        predicted = self._predict(t.name, req.max_tokens, req.true_output) if self._predict else 0
        total = self.cost.total
        prefill = total(n_p, 0)
        t.service += prefill
        t.counter += (total(n_p, predicted) if predicted else prefill) / t.weight
        req.predicted = req.charged_output = predicted
        req.worker, req.dispatched_at = slot.id, now
        slot.committed += req.need
        slot.pending_count += 1
        slot.pending_tokens += req.need
        slot.in_flight += 1
        t.in_flight += 1
        self._in_flight[req.id] = req
        if not at_top:
            self._after_queue_change(t, True)
        elif t.queue:
            self._waiting.replace_top(t.name, t.counter if self._by_counter else t.queue[0].seq)
        else:
            self._waiting.pop_top(t.name)
            self._last_left = t.name
        return req

    def _after_queue_change(self, t: Tenant, head_changed: bool) -> None:
        if not t.queue:
            self._waiting.remove(t.name)
            self._last_left = t.name
        elif head_changed and not self._by_counter:
            self._waiting.push(t.name, self._key(t))

    def _mark_started(self, req: Request, prompt_tokens: int, lowered: list[Tenant]) -> None:
        req.started = True
        slot = self.workers.slots.get(req.worker or "")
        if prompt_tokens != req.prompt_tokens:  # the engine's exact count replaces the estimate
            t = self.tenants[req.tenant]
            total = self.cost.total
            t.service += total(prompt_tokens, req.output_tokens) - total(req.prompt_tokens, req.output_tokens)
            t.counter += (
                total(prompt_tokens, req.charged_output) - total(req.prompt_tokens, req.charged_output)
            ) / t.weight
            delta = prompt_tokens - req.prompt_tokens
            req.prompt_tokens = prompt_tokens
            req.need += delta
            if slot is not None:
                slot.committed += delta
                slot.pending_tokens += delta
            if delta < 0:
                lowered.append(t)
        if slot is not None:
            slot.pending_count -= 1
            slot.pending_tokens -= req.need

    def _release(self, req: Request) -> None:
        slot = self.workers.get(req.worker or "")
        if slot is None:
            return
        slot.committed -= req.need
        slot.in_flight -= 1
        if not req.started:
            slot.pending_count -= 1
            slot.pending_tokens -= req.need

    def _refund_dispatch(self, t: Tenant, req: Request) -> None:
        """Undo a dispatch that produced nothing: the request was never served."""
        total = self.cost.total
        t.service -= total(req.prompt_tokens, 0)
        t.counter -= total(req.prompt_tokens, req.charged_output) / t.weight
        if self._by_counter and t.queue:
            self._waiting.push(t.name, t.counter)

    def _drop_head(self, t: Tenant, reason: str) -> None:
        req = t.queue.popleft()
        t.queued_tokens -= req.prompt_tokens + req.max_tokens
        t.rejected += 1
        self._queued_ids.pop(req.id, None)
        self._after_queue_change(t, True)
        self.dropped.append((req, reason))

    def _relaxed_pick(self) -> tuple[Tenant, WorkerSlot] | None:
        """Relaxed head-of-line: the least-served tenant whose oldest request fits somewhere."""
        for name in self._waiting.smallest(self.config.relaxed_scan)[1:]:
            t = self.tenants[name]
            slot = self.workers.place(t.queue[0].need)
            if slot is not None:
                return t, slot
        return None


def _optional(value: Any, kind: type) -> Any:
    return None if value is None else kind(value)
