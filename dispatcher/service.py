"""The dispatcher's asyncio shell around the pure core: the Dispatcher gRPC service (workers' streams)
and ``submit``.

Everything runs on one event loop, so the core needs no locks. Assignment runs after every event that
can change capacity or demand (a submit, a worker's report or finish, a worker joining or leaving),
never on a polling timer. Every queued request is one pending ``submit`` call, resolved with the
worker's address and a signed ticket when the core assigns it. The Ray actor is a thin wrapper.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from fairgate.common.rpc import fairgate_pb2 as pb
from fairgate.common.rpc import fairgate_pb2_grpc as rpc
from fairgate.common.tickets import (
    WORKER_AUTH_HEADER,
    NonceBook,
    TicketFields,
    check_worker_token,
    sign,
    ticket_message,
)
from fairgate.core import FINISH_WORKER_LOST, REJECT_QUEUE_TIMEOUT, FairScheduler, SchedulerConfig
from fairgate.core.fairness import backlogged_gap
from fairgate.core.quotas import Prices, QuotaBook, Refusal
from fairgate.core.reasons import FINISH_REVOKED, REJECT_OBJECTIVE, REJECT_QUOTA
from fairgate.core.shards import LastRound, ShardReport, ShardSender
from fairgate.core.wait_prediction import ObjectiveMiss
from fairgate.dispatcher.metrics import Histogram
from fairgate.dispatcher.report_pace import ReportPace

log = logging.getLogger(__name__)

WORKER_HELLO_S = 10.0  # a worker stream must say hello within this, or it is closed
MAX_WORKER_STREAMS = 1024  # streams the workers' endpoint serves at once (replicas of one pool, and slack)


class Rejected(Exception):
    """The core refused a request (``reason``: rate_limited, too_large, ...); ``message`` and
    ``retry_after_s`` when the refusal has its own (a quota: which one, and when its window turns)."""

    def __init__(self, reason: str, message: str = "", retry_after_s: float = 0.0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.message = message
        self.retry_after_s = retry_after_s


class Redirected(Exception):
    """A waiting request was dealt to another dispatcher shard (``shard``): its caller asks that one,
    with the same id (``retry``), where it waits without being lifted (it waited all along)."""

    def __init__(self, shard: str) -> None:
        super().__init__(f"dealt to shard {shard}")
        self.shard = shard


def rejected(reason: str, refusal: Refusal | None, shed: ObjectiveMiss | None = None) -> Rejected:
    """The refusal for ``reason``, with the quota's own words when a quota refused it, and the
    objective's when its class shed it (retry once the predicted wait has passed)."""
    if reason == REJECT_OBJECTIVE and shed is not None:
        message = (
            f"request class {shed.klass!r} cannot meet its {shed.objective_s:g} s first-token objective now "
            f"(predicted wait {shed.predicted_s:.2g} s); retry later"
        )
        return Rejected(reason, message, max(1.0, shed.predicted_s))
    if reason != REJECT_QUOTA or refusal is None:
        return Rejected(reason)
    rule = refusal.rule
    message = (
        f"this request could use more than {rule.node!r}'s quota per {rule.window} has left ({refusal.left});"
        f" it resets in {refusal.retry_after_s:.0f} s"
    )
    return Rejected(reason, message, refusal.retry_after_s)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an assigned request runs, and the ticket the worker will check."""

    request_id: str
    worker_id: str
    address: str
    ticket: TicketFields
    signature: bytes

    def ticket_message(self) -> pb.Ticket:
        return ticket_message(self.ticket, self.signature)


@dataclass
class _WorkerLink:
    address: str
    outbox: asyncio.Queue[pb.DispatcherMessage | None]
    released: bool = False


class DispatcherService:
    def __init__(
        self,
        config: SchedulerConfig,
        secret: bytes,
        *,
        ticket_ttl_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        observe: bool = True,
        quotas: QuotaBook | None = None,
        prices: Prices | None = None,
    ) -> None:
        self.scheduler = FairScheduler(config, quotas, prices)
        self.id = uuid.uuid4().hex[:8]
        self._secret = secret
        self._ttl = ticket_ttl_s
        self._clock = clock
        self._pending: dict[str, asyncio.Future[Placement]] = {}
        # requests put back in their queues when their worker died, waiting for their caller to ask again
        self._orphans: dict[str, asyncio.Future[Placement]] = {}
        # assigned, unstarted and reached their workers (until their tickets expire): when each was assigned
        self._arrived: dict[str, float | None] = {}
        self.cache_groups: dict[str, str] = {}  # tenant -> its cache sharing group, for the tickets
        self.adapter_paths: dict[str, str] = {}  # adapter -> where its weights are, for the tickets
        self.adapter_loads: dict[str, list[float]] = {}  # adapter -> [loads, seconds], reported by workers
        self._links: dict[str, _WorkerLink] = {}
        self._server: grpc.aio.Server | None = None
        self._nonces = NonceBook()  # worker credentials taken (each attaches once)
        self._expiry: asyncio.TimerHandle | None = None
        self.address = ""
        self._observe = observe  # latency histograms (benchmarks measure the service without them)
        self.ttft = Histogram()  # submit -> first reported token, on this clock
        self.latency = Histogram()  # submit -> finish
        self.dispatched = 0
        self.worker_messages = 0  # hellos, step reports and goodbyes received (load tests read it)
        self._pace = ReportPace(clock())  # what the workers were last told
        self._pass_due = False  # an assignment pass is scheduled for the end of this turn of the loop
        self._shard = ShardSender(self.scheduler)  # its side of the rounds, when it is a shard
        self._durable_seq = 0  # its last batch held by a durable state it saved
        self._last_round = LastRound(0, {}, {})  # the fleet's figures it last adopted

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._server = grpc.aio.server(maximum_concurrent_rpcs=MAX_WORKER_STREAMS)
        rpc.add_DispatcherServicer_to_server(_DispatcherServicer(self), self._server)
        bound = self._server.add_insecure_port(f"{host}:{port}")
        await self._server.start()
        self.address = f"{host}:{bound}"
        return self.address

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        for link in self._links.values():
            link.outbox.put_nowait(None)
        if self._server is not None:
            await self._server.stop(grace=0.5)

    def durable_state(self, rounds: bool = False) -> dict[str, Any]:
        """The scheduler's durable state, stamped with when it was saved on this service's clock (the
        tickets' clock); ``rounds`` (a shard): with its side of the shards' rounds, taken at the same
        moment."""
        state = self.scheduler.durable_state(saved_at=self._clock())
        if rounds:
            state["rounds"] = self._shard.state()
        return state

    def saved(self, state: Mapping[str, Any]) -> None:
        """``state`` (from ``durable_state``) is stored: the rounds need not keep its batches to take back."""
        if "rounds" in state:
            self._durable_seq = max(self._durable_seq, int(state["rounds"]["seq"]))

    def restore(self, saved: dict[str, Any]) -> None:
        """Continue from a durable state (a restart): requests the dispatcher before assigned after
        it was saved and that ended meanwhile are settled when their workers re-announce them. As a
        shard, it goes on with the rounds' state saved with it; the rounds take back what it sent
        after it (``FleetFigures.restart``): its workers report that work again."""
        self.scheduler.restore_durable(saved, now=self._clock())
        self._shard = ShardSender.restored(self.scheduler, saved.get("rounds"))
        self._durable_seq = self._shard.seq

    # ------------------------------------------------------------------ shards (fairgate.core.shards)

    def round_batches(self) -> ShardReport:
        """This shard's part of a round: its change batches not yet combined, how many requests of each
        tenant wait here, its workers taking work (its capacity), and which life of it this is."""
        return ShardReport(
            self._shard.batches(),
            self.scheduler.waiting_counts(),
            len(self.scheduler.workers.taking_work),
            self.id,
            self._durable_seq,
        )

    def hand_over(self, tenant: str, count: int, to: str) -> int:
        """Deal up to ``count`` of ``tenant``'s waiting requests, the newest, to shard ``to``: each
        leaves this queue and its caller is told to ask there. Returns how many went (one whose caller
        has not asked again since a worker loss stays)."""
        moved = 0
        for req in reversed(self.scheduler.queued(tenant)):
            if moved == count:
                break
            future = self._pending.get(req.id)
            if future is None or future.done() or self._orphans.get(req.id) is future:
                continue
            if self.scheduler.hand_over(req.id) is None:
                continue
            del self._pending[req.id]
            future.set_exception(Redirected(to))
            moved += 1
        return moved

    def round_adopt(self, last: LastRound, name: str, waiting_elsewhere: Iterable[str]) -> None:
        """The fleet's figures after a round (this shard, ``name``, has its batches up to
        ``last.combined[name]`` in them)."""
        self._shard.adopt(last.figures, waiting_elsewhere, last.combined.get(name, 0))
        self._last_round = last
        self._assign_soon()

    def last_round(self) -> LastRound:
        """The fleet's figures this shard last adopted: where a restarted rounds' runner goes on from."""
        return self._last_round

    # ------------------------------------------------------------------ ingress API

    async def submit(
        self,
        request_id: str,
        tenant: str,
        prompt_tokens: int,
        max_tokens: int,
        *,
        retry: bool = False,
        prefix: tuple[int, ...] = (),
        block_tokens: int = 0,
        cache_group: str = "",
        klass: str = "",
        adapter: str = "",
    ) -> Placement:
        """Queue a request; return once the core assigns it. Cancelling the call withdraws it.

        ``retry``: the caller asks again for a request it submitted before, with the same id, because
        its worker could not be reached or the dispatcher restarted. A request put back in its queue
        keeps its place; one still assigned but never started goes back to the head of its queue; one
        this dispatcher does not know is queued afresh. Never two copies of one request. ``prefix``:
        its prompt's block hashes, salted by ``cache_group`` (the ticket names it, so the worker salts
        the engine's cache the same way; "" : the tenant's own). ``klass``: its request class ("": the
        default); a class's requests run as their class's leaf and share the tenant's cache. ``adapter``:
        the LoRA adapter it is served with (its path in ``adapter_paths``; "": the base model)."""
        leaf = self.scheduler.class_leaf(tenant, klass).name if klass else tenant
        group = cache_group or tenant
        if group != leaf:
            self.cache_groups[leaf] = group
        else:
            self.cache_groups.pop(leaf, None)
        future = self._orphans.pop(request_id, None) if retry else None
        if future is None:
            future = self._queue(
                request_id, tenant, prompt_tokens, max_tokens, retry, prefix, block_tokens, klass, adapter
            )
        try:
            return await future
        except asyncio.CancelledError:
            if self._pending.pop(request_id, None) is not None:
                self.scheduler.cancel(request_id)
            elif future.done() and not future.cancelled() and future.exception() is None:
                self.release(request_id)  # assigned just before the withdraw: no one will run it
            raise

    def _queue(
        self,
        request_id: str,
        tenant: str,
        prompt_tokens: int,
        max_tokens: int,
        retry: bool,
        prefix: tuple[int, ...] = (),
        block_tokens: int = 0,
        klass: str = "",
        adapter: str = "",
    ) -> asyncio.Future[Placement]:
        s = self.scheduler
        known = s.in_flight().get(request_id)
        if retry and known is not None:
            if known.started:  # it runs: its caller lost the stream, so stop it there
                self.abort(request_id)
                raise Rejected(FINISH_WORKER_LOST)
            s.requeue(request_id)
        elif retry and s.was_lost(request_id):  # it had started on a worker that died: never twice
            raise Rejected(FINISH_WORKER_LOST)
        elif not (retry and s.is_queued(request_id)):
            reason = s.submit(
                request_id,
                tenant,
                prompt_tokens,
                max_tokens,
                self._clock(),
                resumed=retry,
                prefix=prefix,
                block_tokens=block_tokens,
                klass=klass,
                adapter=adapter,
            )
            if reason is not None:
                raise rejected(reason, s.last_refusal, s.last_shed)
        stale = self._pending.get(request_id)
        if stale is not None and not stale.done():
            stale.cancel()
        future: asyncio.Future[Placement] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self._schedule_expiry()
        self._assign_soon()
        return future

    def release(self, request_id: str) -> None:
        """The caller of an assigned request gave up on it before it started (it failed on the way to
        its worker, or the client left): free its reservation and refund it now, not when its ticket
        expires; stop it on its worker in case it got there."""
        self._orphans.pop(request_id, None)
        req = self.scheduler.in_flight().get(request_id)
        if req is None:
            return
        self.abort(request_id)
        if not req.started:
            self.scheduler.on_finish(request_id, 0, "abort", self._clock())
            self._assign_soon()

    def abort(self, request_id: str) -> None:
        """The client of an assigned request is gone: stop it on its worker."""
        req = self.scheduler.in_flight().get(request_id)
        if req is not None and req.worker in self._links:
            self._links[req.worker].outbox.put_nowait(pb.DispatcherMessage(abort=pb.Abort(request_id=request_id)))

    def drain(self, worker_id: str) -> None:
        """Stop assigning to a worker and ask it to finish what it runs, then leave."""
        self.scheduler.worker_drain(worker_id)
        link = self._links.get(worker_id)
        if link is not None:
            link.outbox.put_nowait(pb.DispatcherMessage(drain=pb.Drain()))

    def telemetry(self) -> dict[str, Any]:
        """Stats plus what operators watch: latency histograms, dispatches, the gap and its bound."""
        data = self.stats()
        self._add_fairness(data)
        data.update(
            ttft=self.ttft.snapshot(),
            latency=self.latency.snapshot(),
            objectives=dict(self.scheduler.waits.views()),
            adapters=self._adapter_rows(data["workers"]),
        )
        return data

    def sample(self) -> dict[str, Any]:
        """What the service history and the OTLP exporter read every second: the tenants', the nodes'
        and the fairness figures of ``telemetry``, none per worker: a sample's work, which holds the
        event loop, does not grow with the fleet."""
        data = self.scheduler.tenant_stats()
        data["queue_depth"] = self.scheduler.queue_depth()
        self._add_fairness(data)
        return data

    def _add_fairness(self, data: dict[str, Any]) -> None:
        """Dispatches, who is backlogged and with how much, the gap and its bound, into ``data``."""
        tenants = data["tenants"]
        backlogged = self.scheduler.waiting_tenants()
        data.update(
            dispatched=self.dispatched,
            backlogged=backlogged,
            backlog_tokens=sum(t["queued_tokens"] for t in tenants.values()),
            gap=self._gap(tenants, backlogged, data["nodes"]),
            two_u=self.scheduler.fairness_bound(),
        )

    def _adapter_rows(self, workers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Per adapter: the workers holding it on the GPU and in host memory, its loads and their time."""
        rows: dict[str, dict[str, Any]] = {}

        def row(name: str) -> dict[str, Any]:
            return rows.setdefault(name, {"gpu": [], "host": [], "loads": 0, "load_seconds": 0.0})

        for w in workers:
            for name in w.get("gpu_adapters", ()):
                row(name)["gpu"].append(w["id"])
            for name in w.get("host_adapters", ()):
                row(name)["host"].append(w["id"])
        for name, (loads, seconds) in self.adapter_loads.items():
            row(name).update(loads=int(loads), load_seconds=seconds)
        return rows

    def _gap(self, tenants: dict[str, Any], backlogged: list[str], nodes: dict[str, Any]) -> float:
        """The largest counter gap between backlogged tenants (in a tree: between backlogged siblings,
        at any level; each node's own is in its stats row)."""
        if not nodes:
            return backlogged_gap({n: t["counter"] for n, t in tenants.items()}, backlogged)
        gaps = self.scheduler.sibling_gaps()
        for name, row in nodes.items():
            row["gap"] = gaps.get(name, 0.0)
        return max(gaps.values(), default=0.0)

    def stats(self) -> dict[str, Any]:
        data = self.scheduler.stats()
        for row in data["workers"]:
            link = self._links.get(row["id"])
            row["address"] = link.address if link else ""
        data["pending_submits"] = len(self._pending)
        data["orphans"] = len(self._orphans)
        data["dispatcher_id"] = self.id
        index = self.scheduler.prefixes
        data["prefix_index"] = {
            "agreement": index.agreement(),
            "compared": index.compared,
            "workers": index.stats(),
            "event_fed": sorted(wid for wid, row in index.stats().items() if row.get("fed")),
        }
        return data

    # ------------------------------------------------------------------ internals

    def _schedule_expiry(self) -> None:
        """While anything waits, sweep for requests queued too long, a tenth of the limit apart."""
        limit = self.scheduler.config.max_queue_s
        if limit is not None and self._expiry is None:
            self._expiry = asyncio.get_running_loop().call_later(min(1.0, limit / 10), self._expire)

    def _expire(self) -> None:
        """Requests that waited longer than the configured maximum are refused (503, retry later)."""
        self._expiry = None
        for request_id in self.scheduler.expire(self._clock()):
            self._orphans.pop(request_id, None)
            future = self._pending.pop(request_id, None)
            if future is not None and not future.done():
                future.set_exception(Rejected(REJECT_QUEUE_TIMEOUT))
        if self.scheduler.queue_depth():
            self._schedule_expiry()

    def _assign_soon(self) -> None:
        """An assignment pass once the events that arrived together are applied: the worker messages
        and submits handled in one turn of the event loop make one pass between them, not one each."""
        if not self._pass_due:
            self._pass_due = True
            asyncio.get_running_loop().call_soon(self._assign)

    def _assign(self) -> None:
        self._pass_due = False
        now = self._clock()
        loop = asyncio.get_running_loop()
        for a in self.scheduler.assign(now):
            self.dispatched += 1
            req = a.request
            future = self._pending.pop(req.id, None)
            if future is None or future.done():  # its caller left in the meantime
                self.scheduler.on_finish(req.id, 0, "abort", now)
                continue
            group = self.cache_groups.get(req.tenant, "")
            size = (req.prompt_tokens, req.max_tokens)
            path = self.adapter_paths.get(req.adapter, "") if req.adapter else ""
            fields = TicketFields(
                req.id, req.tenant, a.worker_id, now + self._ttl, *size, group, req.priority, req.adapter, path
            )
            link = self._links.get(a.worker_id)
            future.set_result(
                Placement(req.id, a.worker_id, link.address if link else "", fields, sign(self._secret, fields))
            )
            loop.call_later(self._ttl, self._expire_unstarted, req.id, req.dispatched_at)
        for req, reason in self.scheduler.take_dropped():
            future = self._pending.pop(req.id, None)
            if future is not None and not future.done():
                future.set_exception(rejected(reason, self.scheduler.dropped_refusal(req.id)))
        self._revoke()
        self._release_drained()
        self._set_pace()

    def _revoke(self) -> None:
        """Ask workers for the requests the core would take back (revocation by over-service): each
        answers with a ``revoked`` finish if its engine had not started it, and says nothing otherwise
        (the start report ends the round)."""
        for request_id, worker_id in self.scheduler.revocations():
            link = self._links.get(worker_id)
            if link is None:
                self.scheduler.revocation_answered(request_id)
                continue
            link.outbox.put_nowait(pb.DispatcherMessage(revoke=pb.Revoke(request_id=request_id)))

    def _taken_back(self, request_id: str) -> None:
        """A worker took ``request_id`` back unstarted (the core put it back in its queue): its caller,
        told by the worker, asks again; until then a placement waits for it here. (A caller that asked
        first has put it back itself, and waits on its own.)"""
        if self.scheduler.is_queued(request_id) and request_id not in self._pending:
            future = self._orphans[request_id] = asyncio.get_running_loop().create_future()
            self._pending[request_id] = future

    def _set_pace(self) -> None:
        """Tell the workers a new report pace when waiting requests appear or have been gone a while,
        or the dispatcher's load changed (``ReportPace``)."""
        if self._pace.update(self._clock(), self.scheduler.queue_depth() > 0):
            for link in self._links.values():
                link.outbox.put_nowait(self._pace_message())

    def _pace_message(self) -> pb.DispatcherMessage:
        return pb.DispatcherMessage(pace=pb.Pace(report_interval_s=self._pace.report_s))

    def _release_drained(self) -> None:
        """Tell each draining worker once nothing assigned to it is still on its way."""
        for slot in self.scheduler.workers.draining:
            link = self._links.get(slot.id)
            if link is not None and not link.released and slot.pending_count == 0:
                link.released = True
                link.outbox.put_nowait(pb.DispatcherMessage(released=pb.Released()))

    def _forget_orphan(self, request_id: str) -> None:
        """A request put back in its queue turned out to run on its worker after all (adopted): no
        caller will ask for it again."""
        future = self._orphans.pop(request_id, None)
        if future is not None:
            if self._pending.get(request_id) is future:
                del self._pending[request_id]
            future.cancel()

    def _expire_unstarted(self, request_id: str, dispatched_at: float | None) -> None:
        """An assignment whose ticket expired before it reached its worker frees its reservation. One
        that reached it waits in its engine's queue: it keeps its reservation and runs when the engine
        takes it (aborting it would answer its client with nothing). A later assignment of the same
        request (asked again) has a ticket, and an expiry, of its own."""
        arrived = request_id in self._arrived and self._arrived[request_id] == dispatched_at  # it reached its worker
        if arrived:
            del self._arrived[request_id]
        req = self.scheduler.in_flight().get(request_id)
        if req is not None and (req.started or req.dispatched_at != dispatched_at or arrived):
            return
        self.release(request_id)

    def _apply(self, worker_id: str, msg: pb.WorkerMessage) -> str | None:
        """One message from a worker; returns the worker id after a hello."""
        self.worker_messages += 1
        kind = msg.WhichOneof("kind")
        s = self.scheduler
        if kind == "hello":
            h = msg.hello
            joined = (int(h.kv_tokens), h.max_running or None, int(h.free_tokens), int(h.watermark_tokens))
            s.worker_join(h.worker_id, *joined, max_loras=h.max_loras or None)
            for r in h.running:  # after a restart or a broken stream: what it runs, charged from here on
                running = (r.request_id, r.tenant, r.prompt_tokens, r.max_tokens, r.output_tokens, self._clock())
                if s.adopt(h.worker_id, *running, adapter=r.adapter):
                    self._forget_orphan(r.request_id)
            now = self._clock()
            for r in h.ended:  # ended while the stream was down: settled here, exactly once
                args = (r.request_id, r.tenant, r.prompt_tokens, r.max_tokens, r.output_tokens, now)
                assigned_at = r.ticket_expires_at - self._ttl if r.ticket_expires_at else None
                if s.settle_ended(h.worker_id, *args, assigned_at=assigned_at):
                    self._forget_orphan(r.request_id)
            return h.worker_id
        if kind == "report":
            r = msg.report
            in_flight = s.in_flight()
            for rid in r.arrived:  # held by its engine: its ticket's expiry no longer frees it
                req = in_flight.get(rid)
                if req is not None and not req.started and req.worker == worker_id:
                    self._arrived[rid] = req.dispatched_at
            for st in r.started:  # assigned before a restart or a broken stream: adopt it
                adopted = st.request_id not in in_flight and st.tenant
                if adopted and s.adopt(
                    worker_id, st.request_id, st.tenant, st.prompt_tokens, st.max_tokens, 0, self._clock()
                ):
                    self._forget_orphan(st.request_id)
            now = self._clock()
            if self._observe:
                for t in r.new_tokens:
                    req = in_flight.get(t.request_id)
                    if req is not None and req.output_tokens == 0 and t.tokens > 0:
                        self.ttft.observe(now - req.arrival)
            s.on_report(
                worker_id,
                {t.request_id: t.tokens for t in r.new_tokens},
                started={st.request_id: st.prompt_tokens for st in r.started},
                cached={st.request_id: st.cached_tokens for st in r.started},
                free_tokens=int(r.free_tokens),
                running=r.running,
                waiting=r.waiting,
                now=now,
                adapters=tuple(r.adapters) if r.adapters or r.host_adapters else None,
                host_adapters=tuple(r.host_adapters) if r.adapters or r.host_adapters else None,
                kv_events=[(e.kind, e.medium, tuple(e.hashes)) for e in r.kv_events] if r.kv_events else None,
            )
            for name, seconds in r.adapter_load_seconds.items():
                book = self.adapter_loads.setdefault(name, [0, 0.0])
                book[0] += r.adapter_loads.get(name, 1)
                book[1] += seconds
            for f in r.finished:
                req = in_flight.get(f.request_id)
                if req is not None and req.worker != worker_id:  # assigned elsewhere since: a stale copy's end
                    continue
                done = s.on_finish(f.request_id, f.output_tokens, f.reason, now)
                if f.reason == FINISH_REVOKED:
                    self._taken_back(f.request_id)
                elif done is not None and f.reason != "abort" and self._observe:
                    self.latency.observe(now - done.arrival)
            if r.ack:  # its ends are counted: the worker may let their last bytes go
                self._links[worker_id].outbox.put_nowait(pb.DispatcherMessage(acked=r.ack))
        elif kind == "goodbye":
            s.worker_drain(worker_id)
        return worker_id

    async def _serve_worker(
        self, messages: AsyncIterator[pb.WorkerMessage], token: str = ""
    ) -> AsyncIterator[pb.DispatcherMessage]:
        outbox: asyncio.Queue[pb.DispatcherMessage | None] = asyncio.Queue()
        worker: list[str] = []

        async def read() -> None:
            try:
                async for msg in messages:
                    if not worker:
                        if msg.WhichOneof("kind") != "hello":
                            log.warning("dispatcher: a worker stream began without hello; closing it")
                            return
                        hello = msg.hello
                        problem = check_worker_token(
                            self._secret, hello.worker_id, hello.address, token, self._clock(), self._nonces
                        )
                        if problem is not None:
                            log.warning("dispatcher: refused worker %r: %s", msg.hello.worker_id, problem)
                            return
                        wid = self._apply("", msg) or ""
                        worker.append(wid)
                        self._links[wid] = _WorkerLink(msg.hello.address, outbox)
                        outbox.put_nowait(pb.DispatcherMessage(welcome=pb.Welcome(dispatcher_id=self.id)))
                        outbox.put_nowait(self._pace_message())
                    else:
                        self._apply(worker[0], msg)
                    self._assign_soon()
            except Exception:
                log.exception("dispatcher: failed on a message from worker %s; closing its stream", worker)
                raise
            finally:
                outbox.put_nowait(None)

        reader = asyncio.create_task(read())
        silent = asyncio.get_running_loop().call_later(WORKER_HELLO_S, lambda: worker or reader.cancel())
        try:
            while (out := await outbox.get()) is not None:
                yield out
        finally:
            silent.cancel()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            if worker:
                wid = worker[0]
                if self._links.get(wid) is not None and self._links[wid].outbox is outbox:
                    del self._links[wid]
                    left = self.scheduler.worker_leave(wid)
                    if left.lost:
                        log.warning("dispatcher: worker %s left with %d running requests", wid, len(left.lost))
                    loop = asyncio.get_running_loop()
                    for rid in left.requeued:  # kept for their callers, who will ask again (retry)
                        future = self._orphans[rid] = loop.create_future()
                        self._pending[rid] = future
                    self._assign_soon()


class _DispatcherServicer(rpc.DispatcherServicer):
    def __init__(self, service: DispatcherService) -> None:
        self.service = service

    async def Connect(self, request_iterator, context):
        token = dict(context.invocation_metadata() or ()).get(WORKER_AUTH_HEADER, "")
        async for message in self.service._serve_worker(request_iterator, token):
            yield message
