"""A continuous-batching engine over a KV pool, as a pure, deterministic state machine.

Each step admits waiting requests in order while their context fits the pool above the watermark
(vLLM's rule: free blocks, cached ones included, less a reserve kept for the running requests'
growth; prefill also produces their first token), decodes one token for every running request, and
frees requests that reached their length. When decoding runs out of KV space running requests are
preempted as vLLM does (their KV is dropped, they go back to the head of the waiting queue and are
recomputed when they fit again): by default the newest (vLLM's ``fcfs`` policy), or with
``preempt_by="priority"`` the one with the largest priority value, then the newest (vLLM's
``priority`` policy, fed the priorities the dispatcher derives). With preemption off they stall.

With prefix caching on, the engine keeps the KV of prompt blocks after their requests end, as
vLLM does: a request carrying the chained hashes of its prompt's blocks (``prefix``, each covering
``prefix_block`` tokens) shares every leading block already cached, reference-counted, and skips
their prefill; blocks no running request holds stay cached but count as free, and are evicted
least recently used when room is needed. Each request's cached count is reported at its start.

With ``adapters`` set, requests may name a LoRA adapter: a batch holds at most ``max_loras`` distinct
ones (a waiting request whose adapter would be one too many is skipped, keeping its place, as vLLM's
scheduler does), and a step waits for the loads its batch needs (``adapters.AdapterCache``). The
prompt's block hashes a request carries are its adapter's (the caller salts them per adapter, as
vLLM keys its cached blocks by adapter): a prefix cached under one adapter is no hit under another.

With ``tiers`` (``tiers.BlockTier``: host memory beside this engine, a store shared by all), the
prompt blocks a prefill computes are written through to each tier, and a request whose leading blocks
the pool no longer holds finds them there in order (pool, host, shared): they are loaded instead of
recomputed, allocated in the pool like computed ones; the copy runs beside the step's compute, and
a step lasts as long as the longer of the two. With
``kv_events`` the engine reports what its pool and tiers store and evict (``StepReport.kv_events``),
as vLLM publishes its KV cache events, so that the dispatcher's prefix index knows what is cached
instead of modelling it.

``ideal_cache`` is no engine but a ceiling for benchmarks: a set of block hashes shared by every
engine given it, which keeps every block any of them prefilled, forever and in no memory. A request
skips the prefill of its leading blocks found there, so a run with it measures the most that any
placement could get from a trace's reuse.

The engine knows nothing of clocks: ``begin_step`` returns how long the step takes by the step-time
model and ``end_step`` applies it. The simulator advances a virtual clock by that duration; the
real-time simulated worker sleeps for it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from fairgate.workers.engines.interface import FinishedRequest, KVEvent, StepReport
from fairgate.workers.engines.simulated.adapters import AdapterCache, AdapterSettings
from fairgate.workers.engines.simulated.steptime import StepTimeModel
from fairgate.workers.engines.simulated.tiers import MEDIUM_GPU, BlockTier


@dataclass(slots=True)
class EngineRequest:
    """A request inside the engine. ``target_output``: where the (simulated) model stops by itself."""

    id: str
    prompt_tokens: int
    max_tokens: int
    target_output: int
    generated: int = 0
    blocks: int = 0
    ever_started: bool = False
    aborted: bool = False
    prefix: tuple[int, ...] = ()
    prefix_block: int = 0
    cached: int = 0  # prompt tokens found cached when it was last admitted
    shared: list[int] = field(default_factory=list)  # cached blocks' hashes it holds a reference on
    priority: int = 0  # larger: preempted first under ``preempt_by="priority"`` (vLLM's convention)
    order: int = 0  # when it was added: "newest" among equal priorities
    client_leaves: bool = False  # its client goes away at ``target_output`` tokens: it ends as "abort"
    adapter: str = ""  # the LoRA adapter it is served with ("": the base model)

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.generated


PREEMPT_BY = ("newest", "priority")


class SimulatedEngine:
    def __init__(
        self,
        kv_tokens: int,
        step_model: StepTimeModel,
        *,
        block_size: int = 1,
        max_running: int | None = None,
        preemption: bool = True,
        preempt_by: str = "newest",
        watermark: float = 0.0,
        prefix_caching: bool = False,
        ideal_cache: set[int] | None = None,
        adapters: AdapterSettings | None = None,
        tiers: Sequence[BlockTier] = (),
        kv_events: bool = False,
    ) -> None:
        if kv_tokens <= 0 or block_size <= 0:
            raise ValueError("kv_tokens and block_size must be positive")
        if preempt_by not in PREEMPT_BY:
            raise ValueError(f"preempt_by must be one of {', '.join(PREEMPT_BY)}, got {preempt_by!r}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        self.kv_tokens = kv_tokens - kv_tokens % block_size
        self.block_size = block_size
        self.max_running = max_running
        self.preemption = preemption
        self.preempt_by = preempt_by
        self.prefix_caching = prefix_caching
        self.ideal_cache = ideal_cache
        self.step_model = step_model
        self.adapters = AdapterCache(adapters) if adapters is not None else None
        self.tiers = tuple(tiers)  # below the pool, nearest first
        self.kv_events = kv_events
        self._events: list[KVEvent] = []
        self._load_s = 0.0  # this step's loads from the tiers
        self.loaded_tokens_seen = 0  # prompt tokens loaded from a tier instead of prefilled
        self.total_blocks = kv_tokens // block_size
        # blocks a waiting request must leave free when it is admitted beside running ones (vLLM's)
        self.watermark_blocks = int(watermark * self.total_blocks)
        self.used_blocks = 0
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self._by_id: dict[str, EngineRequest] = {}
        self._plan: tuple[list[EngineRequest], list[EngineRequest], float] | None = None
        self._finished_outside_step: list[FinishedRequest] = []
        self._preempted_last = 0
        self._refs: dict[int, int] = {}  # cached block hash -> requests holding it
        self._evictable: OrderedDict[int, int] = OrderedDict()  # held by no one: hash -> KV blocks, LRU first
        self.evictable_blocks = 0
        self.prompt_tokens_seen = 0  # prompt tokens admitted (recomputations included), and found cached
        self.cached_tokens_seen = 0
        self.preemptions = 0  # in all
        self._added = 0
        self._unordered = False  # requests joined the waiting queue since it was last put in rank order

    # ------------------------------------------------------------ interface

    @property
    def free_tokens(self) -> int:
        return (self.total_blocks - self.used_blocks) * self.block_size

    @property
    def watermark_tokens(self) -> int:
        return self.watermark_blocks * self.block_size

    @property
    def in_step(self) -> bool:
        return self._plan is not None

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._finished_outside_step)

    def add(self, req: EngineRequest) -> None:
        if req.id in self._by_id:
            raise ValueError(f"request {req.id!r} already in the engine")
        self._by_id[req.id] = req
        self._added += 1
        req.order = self._added
        self.waiting.append(req)
        self._unordered = True

    def abort(self, request_id: str) -> bool:
        """Stop a request; it is reported finished with reason "abort" at the end of the next step."""
        req = self._by_id.get(request_id)
        if req is None or req.aborted:
            return False
        req.aborted = True
        if not self.in_step:
            (self.waiting if req in self.waiting else self.running).remove(req)
            self._forget(req, "abort", self._finished_outside_step)
        return True

    def output_of(self, request_id: str) -> int | None:
        """Output tokens a request this engine holds has generated (None: not here)."""
        req = self._by_id.get(request_id)
        return None if req is None or req.aborted else req.generated

    def revoke(self, request_id: str) -> bool:
        """Take back a request this engine holds but has never started: it leaves the waiting queue at
        once and never runs here; the caller reports it (no step does). False when it started (a
        preempted one included: it ran) or is not here."""
        req = self._by_id.get(request_id)
        if req is None or req.aborted or req.ever_started or req not in self.waiting:
            return False
        self.waiting.remove(req)
        self._release(req)
        del self._by_id[request_id]
        return True

    def begin_step(self) -> float | None:
        """Plan the next step and return its duration, or None when there is nothing to do."""
        if self._plan is not None:
            raise RuntimeError("begin_step called twice without end_step")
        decode = self._make_decode_room()
        admitted = self._admit()
        if not decode and not admitted:
            return 0.0 if self._finished_outside_step else None
        prefill_tokens = sum(r.context - r.cached for r in admitted)
        load_s, self._load_s = self._load_s, 0.0
        context = sum(r.context for r in decode)
        # the copies run on the GPU's copy engines beside the step's compute (vLLM loads asynchronously)
        duration = max(self.step_model.step_time(prefill_tokens, len(decode), context, len(admitted)), load_s)
        if self.adapters is not None:  # the batch waits for its adapters' loads
            duration += self.adapters.activate(r.adapter for group in (admitted, decode) for r in group)
        self._plan = (admitted, decode, duration)
        return duration

    def end_step(self) -> StepReport:
        """Apply the planned step: one token for each admitted and decoding request."""
        admitted, decode, duration = self._plan or ([], [], 0.0)
        self._plan = None
        report = StepReport(duration)
        report.finished.extend(self._finished_outside_step)
        self._finished_outside_step.clear()
        new_tokens = report.new_tokens
        for req in admitted:
            if self.prefix_caching and req.prefix:
                self._cache_prompt(req)
                for tier in self.tiers:  # written through once computed
                    tier.store(req.prefix, req.prefix_block)
            if self.ideal_cache is not None:
                self.ideal_cache.update(req.prefix)
            if not req.ever_started:
                req.ever_started = True
                report.started[req.id] = req.prompt_tokens
                report.cached[req.id] = req.cached
        for group in (admitted, decode):
            for req in group:
                if req.aborted:
                    continue
                req.generated += 1
                new_tokens[req.id] = 1
        still: list[EngineRequest] = []
        for req in self.running:
            if req.aborted:
                self._forget(req, "abort", report.finished)
            elif req.generated >= req.target_output or req.generated >= req.max_tokens:
                reason = "length" if req.generated >= req.max_tokens else "stop"
                if req.client_leaves and req.generated >= req.target_output:
                    reason = "abort"
                self._forget(req, reason, report.finished)
            else:
                still.append(req)
        self.running = still
        for req in [r for r in self.waiting if r.aborted]:
            self.waiting.remove(req)
            self._forget(req, "abort", report.finished)
        report.free_tokens = self.free_tokens
        report.running = len(self.running)
        report.waiting = len(self.waiting)
        report.preempted = self._preempted_last
        if self.kv_events:
            report.kv_events = self._events
            self._events = []
            for tier in self.tiers:
                report.kv_events.extend(tier.take_events())
        if self.adapters is not None:
            report.adapters = tuple(self.adapters.gpu)
            report.host_adapters = tuple(self.adapters.host)
            report.adapter_loads = self.adapters.step_loads
            self.adapters.step_loads = {}
        return report

    # ------------------------------------------------------------ internals

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _make_decode_room(self) -> list[EngineRequest]:
        """Grow every running request by one token's KV; preempt (or stall) requests if it can't."""
        self._preempted_last = 0
        extra = {r.id: self._blocks_for(r.context + 1) - r.blocks for r in self.running}
        shortfall = sum(extra.values()) - (self.total_blocks - self.used_blocks)
        decode = list(self.running)
        while shortfall > 0 and decode:
            victim = self._victim(decode)
            decode.remove(victim)
            shortfall -= extra.pop(victim.id)
            if self.preemption:
                before = self.used_blocks
                self._release(victim)  # its blocks no one else holds become free (cached ones evictable)
                shortfall -= before - self.used_blocks
                self.running.remove(victim)
                self.waiting.appendleft(victim)
                self._unordered = True
                self._preempted_last += 1
        self.preemptions += self._preempted_last
        for req in decode:
            add = extra[req.id]
            req.blocks += add
            self.used_blocks += add
        self._evict_to_fit()
        return decode

    def _victim(self, decode: list[EngineRequest]) -> EngineRequest:
        """The running request to preempt (or stall) first: the newest, or the largest priority value."""
        if self.preempt_by == "priority" and self.preemption:
            return max(decode, key=lambda r: (r.priority, r.order))
        return decode[-1]

    def _admit(self) -> list[EngineRequest]:
        admitted: list[EngineRequest] = []
        limit = self.max_running
        if self._unordered and self.preempt_by == "priority":  # vLLM's priority policy orders its queue too
            self.waiting = deque(sorted(self.waiting, key=lambda r: (r.priority, r.order)))
        self._unordered = False
        skipped: list[EngineRequest] = []  # their adapter would be one too many in the batch (vLLM skips them)
        batch = {r.adapter for r in self.running if r.adapter}
        while self.waiting and (limit is None or len(self.running) < limit):
            req = self.waiting[0]
            if req.aborted:
                self.waiting.popleft()
                self._forget(req, "abort", self._finished_outside_step)
                continue
            if self.adapters is not None and not self.adapters.fits(batch, req.adapter):
                skipped.append(self.waiting.popleft())
                continue
            blocks = self._blocks_for(req.context + 1)
            hits = self._cached_prefix(req) if self.prefix_caching and req.prefix else []
            shared = len(hits) * self._blocks_for(req.prefix_block)
            revived = sum(self._evictable.get(h, 0) for h in hits)
            watermark = self.watermark_blocks if self.running else 0  # vLLM: only beside running requests
            if blocks - shared + revived + watermark > self.total_blocks - self.used_blocks:
                break
            self.waiting.popleft()
            for h in hits:  # shared, not allocated: a block no one held comes back from the evictable ones
                if h in self._evictable:
                    b = self._evictable.pop(h)
                    self.evictable_blocks -= b
                    self.used_blocks += b
                self._refs[h] = self._refs.get(h, 0) + 1
            req.shared = list(hits)
            found = max(len(hits) + self._load_from_tiers(req, len(hits)), self._ideal_hits(req))
            req.cached = min(found * req.prefix_block, req.prompt_tokens - 1) if found else 0
            self.prompt_tokens_seen += req.prompt_tokens
            self.cached_tokens_seen += req.cached
            req.blocks = blocks
            self.used_blocks += blocks - shared
            self._evict_to_fit()
            self.running.append(req)
            admitted.append(req)
            if req.adapter:
                batch.add(req.adapter)
        self.waiting.extendleft(reversed(skipped))  # they keep their places, ahead of the rest
        return admitted

    def _cached_prefix(self, req: EngineRequest) -> list[int]:
        """The leading blocks of ``req``'s prompt already cached (held or evictable)."""
        if req.prefix_block % self.block_size:
            return []  # cached blocks must be whole KV blocks
        hits: list[int] = []
        refs, evictable = self._refs, self._evictable
        for h in req.prefix:
            if h not in refs and h not in evictable:
                break
            hits.append(h)
        return hits

    def _load_from_tiers(self, req: EngineRequest, start: int) -> int:
        """Blocks of ``req``'s prompt after its ``start`` pool hits that the tiers hold, in order
        without a gap: loaded (the step waits for them), not prefilled."""
        if not self.tiers or not req.prefix or not self.prefix_caching:
            return 0
        at = start
        for tier in self.tiers:
            n = tier.leading(req.prefix, at)
            if n:
                tokens = min(n * req.prefix_block, req.prompt_tokens - 1 - at * req.prefix_block)
                if tokens > 0:
                    self._load_s += tier.settings.load_seconds(tokens)
                    self.loaded_tokens_seen += tokens
                tier.store(req.prefix[at : at + n], req.prefix_block)  # used: most recent there too
                at += n
        return at - start

    def _ideal_hits(self, req: EngineRequest) -> int:
        """How many of ``req``'s leading blocks the ideal cache holds (0 without one)."""
        if self.ideal_cache is None:
            return 0
        n = 0
        for h in req.prefix:
            if h not in self.ideal_cache:
                break
            n += 1
        return n

    def _cache_prompt(self, req: EngineRequest) -> None:
        """After its prefill, ``req``'s own full prompt blocks become cached blocks it holds."""
        held = set(req.shared)
        stored = []
        for h in req.prefix[len(req.shared) :]:
            if h in self._refs or h in self._evictable or h in held:
                continue  # cached meanwhile by another request: this copy stays private
            self._refs[h] = 1
            req.shared.append(h)
            held.add(h)
            stored.append(h)
        if self.kv_events and stored:
            self._events.append(("stored", MEDIUM_GPU, tuple(stored)))

    def _release(self, req: EngineRequest) -> None:
        """Free ``req``'s blocks: private ones at once, shared ones stay cached once no one holds them."""
        per = self._blocks_for(req.prefix_block) if req.shared else 0
        self.used_blocks -= req.blocks - len(req.shared) * per
        for h in reversed(req.shared):  # its last block is evicted first, as vLLM frees a request's blocks
            left = self._refs[h] - 1
            if left:
                self._refs[h] = left
                continue
            del self._refs[h]
            self.used_blocks -= per
            self._evictable[h] = per
            self.evictable_blocks += per
        req.shared = []
        req.blocks = 0

    def _evict_to_fit(self) -> None:
        """Drop the least recently used unheld cached blocks until the pool holds what is in use."""
        evictable = self._evictable
        gone = []
        while self.used_blocks + self.evictable_blocks > self.total_blocks and evictable:
            h, b = evictable.popitem(last=False)
            self.evictable_blocks -= b
            gone.append(h)
        if self.kv_events and gone:
            self._events.append(("removed", MEDIUM_GPU, tuple(gone)))

    def _forget(self, req: EngineRequest, reason: str, into: list[FinishedRequest]) -> None:
        self._release(req)
        self._by_id.pop(req.id, None)
        into.append(FinishedRequest(req.id, req.generated, reason))
