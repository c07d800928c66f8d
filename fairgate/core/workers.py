"""The dispatcher's view of worker capacity, and where a request should go.

Assignment follows each engine's own start rule (docs/architecture.md, "filling each engine as it
fills itself"): a request may go to a worker when that engine would start it now, i.e. its prompt
fits the KV the engine reported free at its last step, above the engine's watermark, less what was
assigned there since and has not started (``pending``);
nothing is reserved for output, which the engine's preemption covers, as it does for the engine alone.
Beyond that, a small queue waits inside each engine so that its next step never lacks work while
the dispatcher's next assignment is on its way: its depth follows how many requests the engine
starts per report (``WorkerSlot.depth``), at most ``max_engine_waiting``. Requests still enter each
engine in the dispatcher's order; the queue's depth is what the fairness bound grows by
(``fairgate.core.fairness.engine_queue_slack``). Over-commit is capped: what is in flight on a worker
may be expected to reach at most ``overcommit`` pools (``Request.footprint``), so that a tenant of
tiny prompts and long outputs cannot fill an engine with far more than it can hold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fairgate.core.model import Request

TURNOVER_SMOOTHING = 0.2  # weight of the newest report in the moving average of starts per report
QUEUE_REPORTS = 2.0  # the engine's queue covers this many reports' worth of starts: one, and one in transit


@dataclass(slots=True)
class WorkerSlot:
    """One worker replica as the dispatcher sees it.

    ``free_tokens``, ``running``, ``waiting``: the engine's own figures at its last report (free KV
    counts cached blocks no request holds, as the engines do). ``watermark``: KV tokens the engine keeps
    free when it admits a request beside running ones. ``committed``: KV needed to admit what runs
    here (prompts), until they finish. ``pending_*``: assigned but not yet reported started, so not yet
    in ``free_tokens``; ``beyond``: those of them assigned beyond the room the engine had (its queue).
    ``turnover``: requests the engine starts per report, smoothed.
    """

    id: str
    kv_tokens: int
    max_running: int | None = None
    free_tokens: int = 0
    running: int = 0
    waiting: int = 0
    committed: int = 0
    pending_count: int = 0
    pending_tokens: int = 0
    in_flight: int = 0
    draining: bool = False
    prompt_tokens: int = 0  # of the requests that started here, and of those found in its prefix cache
    cached_tokens: int = 0
    watermark: int = 0
    turnover: float = 0.0
    beyond: int = 0
    expected: int = 0  # KV the requests in flight here are expected to reach (their footprints)
    max_loras: int | None = None  # LoRA adapters its engine's batch holds at once (None: no adapters)
    adapters_in_flight: dict[str, int] = field(default_factory=dict)  # adapter -> its requests in flight here
    gpu_adapters: tuple[str, ...] = ()  # loaded on its GPU at its last report, least recently used first
    host_adapters: tuple[str, ...] = ()  # and cached in its host memory
    leaving: str = ""  # an adapter given no more requests here, so that its batch makes room (``room_for``)
    room_for: str = ""  # the adapter that room is for
    opened: int = -1  # when it last became able to take work, in its table's count (-1: it cannot now)
    # its table, told whenever something that decides whether it may take work changes (not part of a
    # snapshot): the table keeps the workers that may take work now, instead of scanning them all per decision
    watcher: Callable[[WorkerSlot], None] | None = field(default=None, repr=False, compare=False)

    def touch(self) -> None:
        """Something that decides whether this worker may take work changed."""
        if self.watcher is not None:
            self.watcher(self)

    def room(self) -> int:
        """KV tokens a new request may use here now, by the engine's own rule."""
        return self.free_tokens - self.watermark - self.pending_tokens

    def queued(self) -> int:
        """Requests waiting inside the engine for room: assigned beyond it, or preempted there."""
        return self.beyond + max(0, self.waiting - self.pending_count)

    def depth(self, cap: int) -> int:
        """Requests allowed to wait inside the engine beyond those it can start now."""
        return min(cap, max(1, math.ceil(QUEUE_REPORTS * self.turnover)))  # cap 0: no queue

    def within_overcommit(self, footprint: int, overcommit: float) -> bool:
        """Whether the requests in flight here, with one more of ``footprint``, are expected to reach at
        most ``overcommit`` pools (an empty worker takes any request that fits its pool)."""
        return self.in_flight == 0 or self.expected + footprint <= overcommit * self.kv_tokens

    def starts_now(self, need: int, adapter: str = "") -> bool:
        """Whether the engine would start a request needing ``need`` KV tokens (for ``adapter``) at its
        next step."""
        return (
            (self.max_running is None or self.running + self.pending_count < self.max_running)
            and self.waiting <= self.pending_count  # nothing of its own (preempted) goes first
            and self.room() >= need
            and self.adapter_fits(adapter)
        )

    def adapter_fits(self, adapter: str) -> bool:
        """Whether a request for ``adapter`` ("": the base model) may join the engine's batch: the
        adapter is in it already, or the batch holds fewer than ``max_loras`` (what is in flight here
        counts: what is assigned joins the batch). The engine skips one that may not."""
        if not adapter or self.max_loras is None:
            return True
        if adapter == self.leaving:
            return False
        return adapter in self.adapters_in_flight or len(self.adapters_in_flight) < self.max_loras

    def hold_adapter(self, adapter: str, sign: int = 1) -> None:
        """One more (``sign`` 1) or one fewer (-1) request for ``adapter`` in flight here."""
        if adapter:
            n = self.adapters_in_flight.get(adapter, 0) + sign
            if n > 0:
                self.adapters_in_flight[adapter] = n
            else:
                self.adapters_in_flight.pop(adapter, None)

    def residency(self, adapter: str) -> int:
        """How near ``adapter`` is: 3 in the engine's batch (or no adapter), 2 loaded on its GPU, 1 in
        its host memory, 0 on disk (a load from there)."""
        if not adapter or adapter in self.adapters_in_flight:
            return 3
        return 2 if adapter in self.gpu_adapters else 1 if adapter in self.host_adapters else 0

    def observe_starts(self, started: int) -> None:
        self.turnover += TURNOVER_SMOOTHING * (started - self.turnover)

    def reported(
        self,
        free_tokens: int | None,
        running: int | None,
        waiting: int | None,
        started: int,
        adapters: tuple[str, ...] | None = None,
        host_adapters: tuple[str, ...] | None = None,
    ) -> None:
        """The engine's own figures at its latest step (None: unsaid); ``started``: requests it started."""
        if free_tokens is not None:
            self.free_tokens = free_tokens
            self.observe_starts(started)
        if running is not None:
            self.running = running
        if waiting is not None:
            self.waiting = waiting
        if adapters is not None:
            self.gpu_adapters = adapters
        if host_adapters is not None:
            self.host_adapters = host_adapters
        self.touch()

    def took_back(self, req: Request) -> None:
        """``req``, not reported started, turned out to have begun in this engine's batch (it refused to
        give it back): it is queued here no more."""
        self.beyond -= req.beyond_room
        self.touch()

    def assigned(self, req: Request) -> None:
        """``req`` was handed to this worker: its need is committed here until it ends, and counted as
        pending (and, with no room for it now, as queued in the engine) until it starts."""
        req.beyond_room = not self.starts_now(req.need)
        self.beyond += req.beyond_room
        self.expected += req.footprint
        self.committed += req.need
        self.pending_count += 1
        self.pending_tokens += req.need
        self.in_flight += 1
        self.hold_adapter(req.adapter)
        self.touch()

    def started(self, req: Request, prompt_tokens: int, grew: int) -> None:
        """``req`` started here with ``prompt_tokens`` (``grew`` more than its estimate, already added to
        its need): it is pending no more."""
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += req.cached
        self.committed += grew
        self.pending_count -= 1
        self.pending_tokens -= req.need - grew
        self.beyond -= req.beyond_room
        self.touch()

    def released(self, req: Request) -> None:
        """``req`` ended here (or went back to its queue): what it held is free again."""
        self.committed -= req.need
        self.expected -= req.footprint
        self.in_flight -= 1
        self.hold_adapter(req.adapter, -1)
        if not req.started:
            self.pending_count -= 1
            self.pending_tokens -= req.need
            self.beyond -= req.beyond_room
            req.beyond_room = False
        self.touch()

    def adopted(self, req: Request) -> None:
        """A running request announced by this worker is taken into its books."""
        self.committed += req.need
        self.in_flight += 1
        self.hold_adapter(req.adapter)
        self.touch()

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in SNAPSHOT_FIELDS}


SNAPSHOT_FIELDS = tuple(name for name in WorkerSlot.__slots__ if name != "watcher")


class Placement(Protocol):
    """Picks one worker among those a request fits on (``fairgate.core.placement`` holds the rules).
    ``candidates``: how many of them it needs to see (None: every one)."""

    @property
    def candidates(self) -> int | None: ...

    def choose(self, fits: Sequence[WorkerSlot], request: Request | None) -> WorkerSlot: ...


class WorkerTable:
    """All workers; answers "where can this request start now?"."""

    def __init__(self, placement: Placement, max_engine_waiting: int = 8, overcommit: float = 2.0) -> None:
        self.max_engine_waiting = max_engine_waiting
        self.overcommit = overcommit
        self.placement = placement
        self.slots: dict[str, WorkerSlot] = {}
        self._active: list[WorkerSlot] = []  # not draining; kept current by refresh()
        self._draining: list[WorkerSlot] = []  # and those draining
        # taking work, with room or a short queue, in the order they became so: fits are among these
        self._open: dict[str, WorkerSlot] = {}
        self._making_room: dict[str, WorkerSlot] = {}  # taking work, with an adapter leaving their batch
        self.largest_pool = 0  # the largest KV pool among workers taking work (0 when there are none)
        self.reserve = 0.0  # share of each pool only urgent requests may start into (objectives enforced)

    def refresh(self) -> None:
        """Recompute the cached list of workers taking work (after join, drain or leave)."""
        self._active = [w for w in self.slots.values() if not w.draining]
        self._draining = [w for w in self.slots.values() if w.draining]
        self.largest_pool = max((w.kv_tokens for w in self._active), default=0)
        opened = sorted((w for w in self._active if w.opened >= 0), key=lambda w: w.opened)
        self._open = {w.id: w for w in opened}
        self._making_room = {w.id: w for w in self._active if w.leaving}
        for w in self.slots.values():
            w.watcher = self._watch
            self._watch(w)

    def _slack(self, w: WorkerSlot) -> bool:
        """Whether ``w`` could take one more request of some size: it starts one now, or its queue is
        short (what ``fits`` asks of a request's own size implies this)."""
        return w.queued() < w.depth(self.max_engine_waiting) or w.starts_now(1)

    def _watch(self, w: WorkerSlot) -> None:
        """``w`` changed: it joins the open workers (last) or leaves them. The work per decision
        follows what changed, not the number of workers."""
        if not w.draining and self.slots.get(w.id) is w and self._slack(w):
            if w.id not in self._open:
                last = next(reversed(self._open.values()), None)  # numbered from what is open: a restore agrees
                w.opened = last.opened + 1 if last is not None else 0
                self._open[w.id] = w
        elif w.opened >= 0:
            w.opened = -1
            self._open.pop(w.id, None)

    @property
    def taking_work(self) -> list[WorkerSlot]:
        """The workers not draining."""
        return self._active

    @property
    def draining(self) -> list[WorkerSlot]:
        """The workers draining (none but these are asked whether they are done)."""
        return self._draining

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, worker_id: str) -> WorkerSlot:
        return self.slots[worker_id]

    def get(self, worker_id: str) -> WorkerSlot | None:
        return self.slots.get(worker_id)

    def join(
        self,
        worker_id: str,
        kv_tokens: int,
        max_running: int | None,
        free_tokens: int | None,
        watermark: int = 0,
        max_loras: int | None = None,
    ) -> None:
        if kv_tokens <= 0:
            raise ValueError(f"worker {worker_id!r}: KV pool must be positive, got {kv_tokens}")
        if not 0 <= watermark < kv_tokens:
            raise ValueError(f"worker {worker_id!r}: watermark must be in [0, {kv_tokens}), got {watermark}")
        slot = self.slots.get(worker_id)
        if slot is None:
            free = kv_tokens if free_tokens is None else free_tokens
            self.slots[worker_id] = WorkerSlot(
                worker_id, kv_tokens, max_running, free_tokens=free, watermark=watermark, max_loras=max_loras
            )
        else:  # a re-announcing worker keeps what is committed to it
            slot.kv_tokens, slot.max_running, slot.draining = kv_tokens, max_running, False
            slot.watermark, slot.max_loras = watermark, max_loras
            if free_tokens is not None:
                slot.free_tokens = free_tokens
        self.refresh()

    def drain(self, worker_id: str) -> None:
        slot = self.slots.get(worker_id)
        if slot is not None:
            slot.draining = True
            self.refresh()

    def leave(self, worker_id: str) -> WorkerSlot | None:
        slot = self.slots.pop(worker_id, None)
        self.refresh()
        return slot

    def has_slack(self) -> bool:
        """Whether some worker could take one more request (its size is checked in ``place``)."""
        return bool(self._open)  # any adapter: checked in place

    def place(self, need: int, request: Request | None = None) -> WorkerSlot | None:
        """The worker that should get a request needing ``need`` KV tokens to start, or None: one whose
        engine would start it now, or whose queue is short of its depth. While objectives are enforced
        (``reserve``), other requests leave that share of each pool free, and wait inside an engine only
        where it has that room (what an engine queues it starts as room frees, reserve or not)."""
        footprint = request.footprint if request is not None and request.footprint else need
        if request is not None and request.urgent:
            return self._urgent_place(need, footprint, request.adapter)
        fits = self.fits(need, footprint, request.adapter if request is not None else "", self.placement.candidates)
        if not fits:
            return None
        return fits[0] if len(fits) == 1 else self.placement.choose(fits, request)

    def fits(self, need: int, footprint: int, adapter: str = "", limit: int | None = None) -> list[WorkerSlot]:
        """The workers a request needing ``need`` KV tokens to start, expected to reach ``footprint``
        (for ``adapter``), may go to now (not urgent): those it starts on now, and those whose queue is
        short, where its adapter may join the batch (an engine skips a request whose adapter may not).
        ``limit``: the first that many found are enough (those that could take work longest first)."""
        cap, over = self.max_engine_waiting, self.overcommit
        found: list[WorkerSlot] = []
        for w in self._open.values():
            if w.adapter_fits(adapter) and self._takes(w, need, cap) and w.within_overcommit(footprint, over):
                found.append(w)
                if len(found) == limit:
                    break
        return found

    def takes(self, w: WorkerSlot, request: Request) -> bool:
        """Whether ``w`` is among ``fits`` for a request that is not urgent."""
        footprint = request.footprint or request.need
        return (
            not w.draining
            and w.adapter_fits(request.adapter)
            and self._takes(w, request.need, self.max_engine_waiting)
            and w.within_overcommit(footprint, self.overcommit)
        )

    def _takes(self, w: WorkerSlot, need: int, cap: int) -> bool:
        if not self.reserve:
            return w.starts_now(need) or (w.queued() < w.depth(cap) and need <= w.kv_tokens)
        kept = need + int(self.reserve * w.kv_tokens)
        return w.starts_now(kept) or (w.queued() < w.depth(cap) and w.room() >= kept)

    def _urgent_place(self, need: int, footprint: int, adapter: str = "") -> WorkerSlot | None:
        """An urgent request (its class enforces a first-token objective) goes where it starts now,
        the reserve included, else to the worker with the most room, past its queue's depth: the engine
        starts it first among what waits there (its priority)."""
        over = self.overcommit
        fits = [
            w
            for w in self._active
            if need <= w.kv_tokens and w.within_overcommit(footprint, over) and w.adapter_fits(adapter)
        ]
        if not fits:
            return None
        now = [w for w in fits if w.starts_now(need)]
        if now:
            return now[0] if len(now) == 1 else self.placement.choose(now, None)
        return max(fits, key=WorkerSlot.room)

    def begin_pass(self) -> None:
        """A new assignment pass: room made where its leaving adapter has left is made (only the workers
        making room are looked at: a pass's work does not grow with the fleet)."""
        for w in list(self._making_room.values()):
            if not w.leaving or w.leaving not in w.adapters_in_flight:
                w.leaving = w.room_for = ""
                del self._making_room[w.id]

    def room_being_made(self, adapter: str) -> tuple[str, str] | None:
        """(worker, adapter leaving its batch) where room is being made for ``adapter``."""
        found = [w for w in self._making_room.values() if w.room_for == adapter and w.leaving]
        if len(found) > 1:  # the first in the table's order, as a restored table finds it
            order = {wid: i for i, wid in enumerate(self.slots)}
            found.sort(key=lambda w: order[w.id])
        return (found[0].id, found[0].leaving) if found else None

    def make_room(self, adapter: str, worker: str, leaving: str) -> None:
        """``leaving`` gets no more requests on ``worker`` until its requests there have ended: then the
        batch has room for ``adapter`` (kept in the slot: a snapshot carries it)."""
        slot = self.slots[worker]
        slot.leaving, slot.room_for = leaving, adapter
        if leaving and not slot.draining:
            self._making_room[worker] = slot

    def snapshot(self) -> list[dict[str, Any]]:
        return [w.to_dict() for w in self.slots.values()]

    def restore(self, rows: Iterable[dict[str, Any]]) -> None:
        names = set(WorkerSlot.__slots__)
        self.slots = {row["id"]: WorkerSlot(**{k: _tupled(k, v) for k, v in row.items() if k in names}) for row in rows}
        self.refresh()


def _tupled(name: str, value: Any) -> Any:
    """A slot's field as it was before JSON (which turns tuples into lists)."""
    return tuple(value) if name in ("gpu_adapters", "host_adapters") else value
