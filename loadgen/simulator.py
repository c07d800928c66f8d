"""The offline simulator: the real scheduler core driving N simulated engines in virtual time.

Nothing here decides anything: arrivals go to ``FairScheduler.submit``, each engine step's report to
``on_report`` / ``on_finish``, and ``assign`` picks what starts, exactly as in the Ray dispatcher.
The clock jumps from event to event (an arrival or the end of some engine's step).

``shards`` > 1 runs several dispatcher shards (``fairgate.core.shards``): each a whole scheduler over
its slice of the engines, their counters exchanged and their waiting requests dealt every ``tau_s``;
arrivals reach the shards in turn (a tenant in ``pinned`` reaches only its shard, as through a single
ingress replica).

``front="round-robin"`` is the fairness-blind baseline a router such as SGLang's or vLLM's gives:
each arrival goes straight to the next engine in turn, and each engine admits by its own rule. A
workload's closed-loop tenants (``Workload.outstanding``) send their next request as one ends.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
from dataclasses import dataclass, field, fields

from tqdm import tqdm

from fairgate.common.prefix_hashes import for_adapter
from fairgate.core import FairScheduler, Request, SchedulerConfig, make_policy
from fairgate.core.classes import default_class, leaf_name
from fairgate.core.costs import CostFunction, LinearCost
from fairgate.core.reasons import FINISH_REVOKED
from fairgate.core.shards import FleetFigures, ShardSender, deals, sharded_bound
from fairgate.loadgen.metrics import RunSummary, ServiceRecorder, Siblings, summarize
from fairgate.loadgen.workload import TraceRequest, Workload
from fairgate.workers.engines.interface import StepReport
from fairgate.workers.engines.simulated import AdapterSettings, EngineRequest, SimulatedEngine, StepTimeModel
from fairgate.workers.engines.simulated.tiers import BlockTier, TierSettings

DEFAULT_KV_TOKENS = 10_000
FRONTS = ("fairgate", "round-robin")


@dataclass
class SimulationConfig:
    """One run's settings. ``kv_tokens`` None: the workload's own pool, else 10,000 tokens per engine.
    ``drain``: keep going after the workload's duration until every admitted request has finished.
    Prefixes matter only for workloads whose requests carry them (``Workload.prefix_block``)."""

    policy: str = "vtc"
    placement: str = "most-room"
    replicas: int = 1
    kv_tokens: int | None = None
    step_model: StepTimeModel = field(default_factory=StepTimeModel.a10g_llama7b)
    cost: CostFunction = field(default_factory=LinearCost)
    strict_head_of_line: bool = True
    preemption: bool = True
    preempt_by: str = "newest"  # the engine's victims: vLLM's default, or "priority" (the dispatcher's ranks)
    watermark: float = 0.0  # fraction of the KV pool the engines keep free when they admit (vLLM's, 0 by default)
    front: str = "fairgate"  # or "round-robin": no dispatcher, the engines' own admission
    block_size: int = 1
    max_running: int | None = None  # the engine's batch limit (vLLM's max_num_seqs)
    max_engine_waiting: int = 8
    overcommit: float = 2.0  # pools of expected KV a worker takes in flight (the dispatcher's setting)
    seed: int = 42
    drain: bool = False
    prefix_caching: bool = True  # the engines keep a prefix cache (as vLLM does by default)
    sees_prefix: bool = True  # the dispatcher gets prompts' block hashes and cached counts (False: prefix-blind)
    ideal_cache: bool = False  # a ceiling, not an engine: every prefilled block cached on every replica, free
    host_tier: TierSettings | None = None  # each engine's host-memory KV tier (None: the pool only)
    shared_tier: TierSettings | None = None  # a KV store every engine shares (None: none)
    kv_events: bool = True  # engines report their KV cache events to a dispatcher that sees prefixes
    revoke: bool = False  # take back unstarted requests of over-served tenants (fairgate.core.revocation)
    adapters: AdapterSettings | None = None  # the engines' LoRA adapter slots and load figures (None: none)
    sees_adapters: bool = True  # the dispatcher knows each engine's adapter slots (False: adapter-blind)
    # an engine's step reports reach the dispatcher merged, at most this often (a worker's report pace;
    # 0: each step's at its end), and at once when the engine has nothing left to step
    report_interval_s: float = 0.0
    shards: int = 1  # dispatcher shards, each over its slice of the engines (``fairgate.core.shards``)
    tau_s: float = 0.05  # the shards' rounds: counters exchanged and waiting requests dealt this often
    pinned: dict[str, int] = field(default_factory=dict)  # tenant -> the one shard its requests reach
    threshold: float | None = None  # the threshold rule's gap (``fairgate.core.threshold``); None: off


def make_scheduler(workload: Workload, config: SimulationConfig) -> FairScheduler:
    """The scheduler with the run's policy, cost and knobs (the fields both configurations share)."""
    shared = {f.name for f in fields(SchedulerConfig)} & {f.name for f in fields(SimulationConfig)}
    settings = {name: getattr(config, name) for name in shared}
    tree = make_policy(config.policy).tree  # a policy that does not order by counters sees every leaf flat
    sched = FairScheduler(SchedulerConfig(**settings, classes=workload.classes if tree else ()))
    for node, parent, weight in workload.tree if tree else ():
        sched.set_node(node, parent or None, weight)
    for name in workload.tenants:
        if name in workload.weights or "~" not in name or not tree:
            sched.add_tenant(name, workload.weight(name), (workload.parents.get(name) or None) if tree else None)
    return sched


class Simulation:
    """One workload under one configuration. ``run`` returns the report entry and plot series;
    ``advance`` is public so tests can stop midway (e.g. to snapshot and restore the scheduler)."""

    def __init__(self, workload: Workload, config: SimulationConfig, progress: bool = False) -> None:
        self.workload = workload
        self.config = config
        self.kv_tokens = config.kv_tokens or workload.kv_tokens or DEFAULT_KV_TOKENS
        if not 1 <= config.shards <= config.replicas or config.tau_s <= 0:
            raise ValueError("shards must be 1 to the number of replicas, and tau_s positive")
        self.shards = [make_scheduler(workload, config) for _ in range(config.shards)]
        # engine i's shard: contiguous slices, as even as the counts allow
        self._shard_of = [i * config.shards // config.replicas for i in range(config.replicas)]
        ideal: set[int] | None = set() if config.ideal_cache else None
        events = config.kv_events and config.sees_prefix
        shared = BlockTier(config.shared_tier, emits=events) if config.shared_tier is not None else None
        self.engines = [
            SimulatedEngine(
                self.kv_tokens,
                config.step_model,
                block_size=config.block_size,
                max_running=config.max_running,
                preemption=config.preemption,
                preempt_by=config.preempt_by,
                watermark=config.watermark,
                prefix_caching=config.prefix_caching,
                ideal_cache=ideal,
                adapters=config.adapters,
                tiers=[
                    *([BlockTier(config.host_tier, emits=events)] if config.host_tier is not None else []),
                    *([shared] if shared is not None else []),
                ],
                kv_events=events,
            )
            for _ in range(config.replicas)
        ]
        self.worker_ids = [f"engine-{i}" for i in range(config.replicas)]
        self._engine_of = {wid: e for wid, e in zip(self.worker_ids, self.engines, strict=True)}
        if config.front not in FRONTS:
            raise ValueError(f"front must be one of {', '.join(FRONTS)}, got {config.front!r}")
        max_loras = config.adapters.max_loras if config.adapters is not None and config.sees_adapters else None
        for i, (wid, engine) in enumerate(zip(self.worker_ids, self.engines, strict=True)):
            self.shards[self._shard_of[i]].worker_join(
                wid, self.kv_tokens, config.max_running, watermark=engine.watermark_tokens, max_loras=max_loras
            )
        self._senders = [ShardSender(shard) for shard in self.shards]
        self._fleet = FleetFigures()  # the same rounds as live shards', without a lost message
        self._capacity = [self._shard_of.count(k) for k in range(config.shards)]
        self._next_round = config.tau_s if config.shards > 1 else math.inf
        self._served_at_round = 0.0
        self.round_service = 0.0  # the most the fleet served between two rounds (the bound's staleness term)
        self.moved = 0  # waiting requests dealt to another shard
        self._next_shard = 0  # the shard the next unpinned arrival reaches
        self._generated: dict[str, int] = {}  # output tokens of a request's earlier runs (taken back)
        self.recomputed_tokens = 0  # prefilled again: the threshold rule's continuations
        tenants = workload.tenants
        self.recorder = ServiceRecorder(
            tenants, [workload.weight(t) for t in tenants], config.cost, charge_cached=config.sees_prefix
        )
        self._prefix_block = workload.prefix_block if config.sees_prefix else 0
        self.now = 0.0
        self._next_arrival = 0
        self._step_end: list[float | None] = [None] * config.replicas
        self._held: list[StepReport | None] = [None] * config.replicas  # steps not reported yet (the pace)
        self._reported_at = [0.0] * config.replicas
        self._largest_report = [0.0] * config.replicas  # the most service one report of each carried
        self._turn = 0  # the round-robin front's next engine
        self._tenant_of: dict[str, TraceRequest] = {}  # closed-loop requests in flight: what to send next
        self._progress = progress

    @property
    def scheduler(self) -> FairScheduler:
        """The dispatcher (the first shard's, when sharded)."""
        return self.shards[0]

    @scheduler.setter
    def scheduler(self, restored: FairScheduler) -> None:
        """Replace it (a test restores it from a snapshot midway; unsharded runs only)."""
        if len(self.shards) != 1:
            raise ValueError("a sharded run's schedulers are replaced shard by shard")
        self.shards[0] = restored
        self._senders = [ShardSender(restored)]

    @property
    def horizon(self) -> float:
        return math.inf if self.config.drain else self.workload.duration_s

    def run(self) -> RunSummary:
        bar = tqdm(
            total=round(self.workload.duration_s),
            unit="sim-s",
            desc=f"{self.workload.name}/{self.config.policy}",
            disable=None if self._progress else True,
            leave=False,
        )
        shown = 0
        while self.advance(until=self.horizon, max_events=2000):
            if int(self.now) > shown:
                bar.update(min(int(self.now), bar.total) - shown)
                shown = min(int(self.now), bar.total)
        bar.close()
        return self.summary()

    def advance(self, until: float, max_events: int = 1 << 62) -> bool:
        """Process events up to time ``until``; False once nothing is left to happen before it."""
        requests = self.workload.requests
        for _ in range(max_events):
            next_arrival = requests[self._next_arrival].arrival_s if self._next_arrival < len(requests) else math.inf
            next_step = min((t for t in self._step_end if t is not None), default=math.inf)
            t = min(next_arrival, next_step)
            if t == math.inf:
                return False
            t = min(t, self._next_round)
            if t > until:
                return False
            self.now = t
            self._finish_steps()
            self._admit_arrivals()
            if t >= self._next_round:
                self._round()
                self._next_round += self.config.tau_s
            self._dispatch()
            self._start_steps()
            shards = self.shards
            self.recorder.sample(t, [any(s.is_backlogged(name) for s in shards) for name in self.recorder.tenants])
        return True

    def summary(self) -> RunSummary:
        duration = self.workload.duration_s if not self.config.drain else max(self.now, 1e-9)
        pool = self.kv_tokens * self.config.replicas
        single = self.scheduler.bound_for(*self.workload.longest(), pool, self.config.replicas) + self.report_lag()
        bound = sharded_bound(single, self.round_service, self.config.shards)
        summary = summarize(
            self.recorder,
            workload=self.workload.name,
            policy=self.config.policy,
            replicas=self.config.replicas,
            kv_tokens=self.kv_tokens,
            duration_s=duration,
            bound=bound,
            siblings=self._siblings(),
        )
        if self.config.threshold is not None:
            served = self.recorder.prompt_tokens_served + self.recorder.output_tokens_served
            one_engine = self.scheduler.bound_for(*self.workload.longest(), self.kv_tokens, 1)
            stated = one_engine + 2.0 * self.config.threshold
            summary.report["threshold"] = {
                "threshold": self.config.threshold,
                "bound": stated,
                "inside_bound": summary.report["max_abs_service_diff"] <= stated,
                "taken": sum(s.threshold.taken for s in self.shards),
                "recomputed_tokens": self.recomputed_tokens,
                "recomputed_share": self.recomputed_tokens / served if served else 0.0,
            }
        if self.config.shards > 1:
            summary.report["shards"] = {
                "shards": self.config.shards,
                "tau_s": self.config.tau_s,
                "round_service": self.round_service,
                "moved": self.moved,
            }
        return summary

    def _siblings(self) -> list[Siblings] | None:
        """The workload's tree as the report checks it (None: flat, every pair compared), as a policy
        that orders by counters builds it (for one that does not, too: its shares are judged alike)."""
        if not self.workload.tree and not self.workload.classes:
            return None
        shape = make_scheduler(self.workload, dataclasses.replace(self.config, policy="vtc"))
        for leaf in self.recorder.tenants:
            tenant, _, klass = leaf.partition("~")
            shape.class_leaf(tenant, klass)
        tree = shape.tree
        index = self.recorder.index
        groups = []
        for node in (tree.root, *tree.nodes.values()):
            kids = list(node.kids.values())
            leaves = [[index[leaf.name] for leaf in tree.leaves(kid) if leaf.name in index] for kid in kids]
            groups.append(Siblings(node.name, [k.name for k in kids], [k.weight for k in kids], leaves))
        return groups

    # ----------------------------------------------------------------- steps

    def _finish_steps(self) -> None:
        rec = self.recorder
        for i, end in enumerate(self._step_end):
            if end is None or end > self.now:
                continue
            self._step_end[i] = None
            engine = self.engines[i]
            report = engine.end_step()
            ended = []
            for done in report.finished:
                taken = done.reason == FINISH_REVOKED or self.shards[self._shard_of[i]].taking_back(done.id)
                if not taken:  # one taken back (unstarted, or running by the threshold rule) has not ended
                    self._send_next(done.id)  # its client has its answer, whenever the dispatcher hears
                    ended.append(done.id)
            rec.on_step(self.now, report.started, report.new_tokens, ended, report.cached)
            held = self._held[i]
            report = report if held is None else held.merged(report)
            paced = self.now - self._reported_at[i] < self.config.report_interval_s
            if paced and engine.has_work():  # its next step's report goes with this one
                self._held[i] = report
                continue
            self._held[i] = None
            self._reported_at[i] = self.now
            self._report(i, report)

    def _report(self, i: int, report: StepReport) -> None:
        """What engine ``i`` did since its last report reaches its dispatcher (shard)."""
        sched = self.shards[self._shard_of[i]]
        served = sched.ledger.total
        sched.on_report(
            self.worker_ids[i],
            report.new_tokens,
            started=report.started,
            free_tokens=report.free_tokens,
            running=report.running,
            waiting=report.waiting,
            cached=report.cached if self._prefix_block else None,
            now=self.now,
            adapters=report.adapters if self.config.sees_adapters else None,
            host_adapters=report.host_adapters if self.config.sees_adapters else None,
            kv_events=report.kv_events,
        )
        for done in report.finished:
            taken = sched.taking_back(done.id)
            sched.on_finish(done.id, done.output_tokens, done.reason, self.now)
            if taken:
                self._continue(sched, done.id, done.output_tokens)
        if self.config.report_interval_s:  # what the dispatcher heard of late: the service it accounted
            self._largest_report[i] = max(self._largest_report[i], sched.ledger.total - served)

    def report_lag(self) -> float:
        """What the fairness bound grows by when reports are merged (``report_interval_s``): the
        dispatcher's counters lag the service by at most what one report of each engine carries (the
        prompts it started and the tokens it generated, at their cost), at
        each end of an interval; twice the sum over engines of the largest one (0 with a report per
        step: the dispatcher hears of each step at its end)."""
        return 2.0 * sum(self._largest_report)

    def _admit_arrivals(self) -> None:
        requests, rec = self.workload.requests, self.recorder
        while self._next_arrival < len(requests) and requests[self._next_arrival].arrival_s <= self.now:
            r = requests[self._next_arrival]
            rid = str(self._next_arrival)
            self._next_arrival += 1
            sched = self._shard_for(r.tenant)
            classes = sched.config.classes
            leaf = sched.class_leaf(r.tenant, r.klass).name if r.klass and classes else r.tenant
            if r.klass and not classes:  # flat (the policy has no tree): the class's leaf as a tenant
                leaf = leaf_name(r.tenant, r.klass, default_class(self.workload.classes))
            rec.on_arrival(rid, leaf, r.arrival_s, r.prompt_tokens, r.output_tokens)
            if r.tenant in self.workload.outstanding:
                self._tenant_of[rid] = r
            asked = r.max_tokens or r.output_tokens
            block = self._prefix_block
            prefix = for_adapter(r.prefix, r.adapter) if block else ()
            if self.config.front == "round-robin":
                engine = self.engines[self._turn % len(self.engines)]
                self._turn += 1
                engine.add(self._engine_request(rid, r.prompt_tokens, asked, r.output_tokens, r))
                continue
            reason = sched.submit(
                rid,
                leaf if not classes else r.tenant,
                r.prompt_tokens,
                asked,
                self.now,
                r.output_tokens,
                prefix=prefix,
                block_tokens=block,
                klass=r.klass if classes else "",
                adapter=r.adapter,
            )
            if reason is not None:
                rec.on_reject(rid, self.now, sched.fits_now(r.prompt_tokens, asked))

    def exchange(self) -> None:
        """A round of the shards now (each also runs every ``tau_s``)."""
        self._round()

    def restart_shard(self, k: int) -> None:
        """Shard ``k``'s dispatcher is lost and restarts from its durable state (as written when it was
        lost, with its rounds' state). Its engines go on: they re-announce what runs there, and the
        callers of what waited there (or was assigned and had not started) ask again."""
        old = self.shards[k]
        state = json.loads(json.dumps(old.durable_state()))
        new = FairScheduler(old.config)
        new.restore_durable(state)
        max_loras = self.config.adapters.max_loras if self.config.adapters and self.config.sees_adapters else None
        again = []
        for i, wid in enumerate(self.worker_ids):
            if self._shard_of[i] != k:
                continue
            engine = self.engines[i]
            new.worker_join(
                wid, self.kv_tokens, self.config.max_running, watermark=engine.watermark_tokens, max_loras=max_loras
            )
            for r in old.in_flight().values():
                if r.worker != wid:
                    continue
                if not r.started and engine.revoke(r.id):  # it never reached the engine's batch: asked again
                    again.append(r)
                    continue
                out = engine.output_of(r.id)  # the engine started it: it re-announces it
                if out is not None:
                    new.adopt(wid, r.id, r.tenant, r.prompt_tokens, r.max_tokens, out, self.now, adapter=r.adapter)
        again += [r for t in old.tenants.values() for r in t.queue]
        for r in sorted(again, key=lambda r: r.seq):
            self._ask_again(new, r)
        self.shards[k] = new
        self._senders[k].attach(new)

    def _shard_for(self, tenant: str) -> FairScheduler:
        """The shard an arrival reaches: its tenant's, if pinned, else the next in turn."""
        pinned = self.config.pinned.get(tenant)
        if pinned is not None:
            return self.shards[pinned % len(self.shards)]
        self._next_shard = (self._next_shard + 1) % len(self.shards)
        return self.shards[self._next_shard]

    def _round(self) -> None:
        """The shards' round: each sends its changes to the counters, all adopt the fleet's figures,
        and every tenant's waiting requests are dealt over the shards by capacity."""
        shards = self.shards
        served = sum(s.ledger.total for s in shards)
        self.round_service = max(self.round_service, served - self._served_at_round)
        self._served_at_round = served
        fleet = self._fleet
        fleet.round({str(k): sender.batches() for k, sender in enumerate(self._senders)})
        waiting = [s.waiting_counts() for s in shards]
        for k, sender in enumerate(self._senders):
            elsewhere = {t for j, w in enumerate(waiting) if j != k for t in w}
            sender.adopt(fleet.figures, elsewhere, fleet.combined.get(str(k), 0))
            fleet.durable(str(k), sender.seq)  # a shard here restarts from its state as it was lost
        for tenant, src, dst, n in deals(waiting, self._capacity):
            for req in shards[src].queued(tenant)[-n:]:  # the newest go; the oldest keep their place
                if shards[src].hand_over(req.id) is not None:
                    self.moved += 1
                    self._ask_again(shards[dst], req)

    def _ask_again(self, sched: FairScheduler, req: Request) -> None:
        """A waiting (or unstarted) request's caller asks ``sched`` for it again, same id: dealt there
        from another shard, or its shard restarted. It keeps its arrival."""
        reason = sched.submit(
            req.id,
            req.tenant,
            req.prompt_tokens,
            req.max_tokens,
            req.arrival,
            req.true_output,
            resumed=True,
            prefix=req.prefix,
            block_tokens=req.block_tokens,
            adapter=req.adapter,
        )
        if reason is not None:
            self.recorder.on_reject(req.id, self.now, False)

    def _continue(self, sched: FairScheduler, rid: str, output_tokens: int) -> None:
        """A running request the threshold rule took back stopped: the rest of it (its prompt and the
        output so far, prefilled again) queues again for its tenant."""
        sched.preemption_answered(rid)
        r = self.workload.requests[int(rid)]
        done = self._generated.get(rid, 0) + output_tokens
        asked = r.max_tokens or r.output_tokens
        if done >= min(asked, r.output_tokens):  # it had ended: nothing left to run
            self._generated.pop(rid, None)
            self.recorder.on_step(self.now, {}, {}, [rid])
            self._send_next(rid)
            return
        self._generated[rid] = done
        prompt = r.prompt_tokens + done
        self.recomputed_tokens += prompt
        reason = sched.submit(
            rid,
            self.recorder.tenants[self.recorder.requests[rid].tenant],
            prompt,
            asked - done,
            self.now,
            r.output_tokens - done,
            resumed=True,
        )
        if reason is not None:
            self.recorder.on_reject(rid, self.now, False)

    def _dispatch(self) -> None:
        """Assign what can start; with revocation, take back what the engines answer for at once (a
        worker answers in a message), and assign again."""
        for sched in self.shards:
            self._assign_once(sched)
            revoked = True
            while revoked:  # until a round takes nothing back (what an engine started stays)
                revoked = False
                for rid, worker in sched.revocations():
                    if self._engine_of[worker].revoke(rid):
                        sched.on_finish(rid, 0, FINISH_REVOKED, self.now)
                        revoked = True
                    else:
                        sched.revocation_answered(rid, refused=True)
                if revoked:
                    self._assign_once(sched)
            for rid, worker in sched.preemptions():
                if not self._engine_of[worker].abort(rid):
                    sched.preemption_answered(rid)

    def _assign_once(self, sched: FairScheduler) -> None:
        requests = self.workload.requests
        for a in sched.assign(self.now):
            req = a.request
            engine_req = self._engine_request(
                req.id, req.prompt_tokens, req.max_tokens, req.true_output, requests[int(req.id)]
            )
            engine_req.priority = req.priority
            self._engine_of[a.worker_id].add(engine_req)
        for req, _ in sched.take_dropped():
            self.recorder.on_reject(req.id, self.now, False)

    def _engine_request(
        self,
        rid: str,
        prompt_tokens: int,
        max_tokens: int,
        true_output: int | None,
        trace: TraceRequest,
    ) -> EngineRequest:
        """The engine's copy of ``trace``'s request: its prompt's block hashes are its adapter's."""
        block = self.workload.prefix_block
        return EngineRequest(
            rid,
            prompt_tokens,
            max_tokens,
            true_output or max_tokens,
            prefix=for_adapter(trace.prefix, trace.adapter) if block else (),
            prefix_block=block,
            client_leaves=trace.leaves,
            adapter=trace.adapter,
        )

    def _send_next(self, rid: str) -> None:
        """A closed-loop tenant's request ended: its next one arrives now (a copy of it, same sizes), in
        its place among the arrivals still to come (other tenants' may be open-loop)."""
        done = self._tenant_of.pop(rid, None)
        if done is not None and self.now < self.workload.duration_s:
            nxt = dataclasses.replace(done, arrival_s=self.now)
            bisect.insort_right(self.workload.requests, nxt, lo=self._next_arrival, key=_arrival)

    def _start_steps(self) -> None:
        for i, engine in enumerate(self.engines):
            if self._step_end[i] is None:
                duration = engine.begin_step()
                if duration is not None:
                    self._step_end[i] = self.now + duration


def _arrival(r: TraceRequest) -> float:
    return r.arrival_s


def simulate(workload: Workload, config: SimulationConfig, progress: bool = False) -> RunSummary:
    return Simulation(workload, config, progress).run()
