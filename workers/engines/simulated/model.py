"""A continuous-batching engine over a KV pool, as a pure, deterministic state machine.

Each step admits waiting requests in order while their context fits the pool (prefill, which also
produces their first token), decodes one token for every running request, and frees requests that
reached their length. When decoding runs out of KV space the newest running requests are preempted
vLLM-style (their KV is dropped and they are recomputed later), or, with preemption off, they stall.

The engine knows nothing of clocks: ``begin_step`` returns how long the step takes by the step-time
model and ``end_step`` applies it. The simulator advances a virtual clock by that duration; the
real-time simulated worker sleeps for it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from workers.engines.interface import FinishedRequest, StepReport
from workers.engines.simulated.steptime import StepTimeModel


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

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.generated


class SimulatedEngine:
    def __init__(
        self,
        kv_tokens: int,
        step_model: StepTimeModel,
        *,
        block_size: int = 1,
        max_running: int | None = None,
        preemption: bool = True,
    ) -> None:
        if kv_tokens <= 0 or block_size <= 0:
            raise ValueError("kv_tokens and block_size must be positive")
        self.kv_tokens = kv_tokens - kv_tokens % block_size
        self.block_size = block_size
        self.max_running = max_running
        self.preemption = preemption
        self.step_model = step_model
        self.total_blocks = kv_tokens // block_size
        self.used_blocks = 0
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self._by_id: dict[str, EngineRequest] = {}
        self._plan: tuple[list[EngineRequest], list[EngineRequest], float] | None = None
        self._finished_outside_step: list[FinishedRequest] = []
        self._preempted_last = 0

    # ------------------------------------------------------------ interface

    @property
    def free_tokens(self) -> int:
        return (self.total_blocks - self.used_blocks) * self.block_size

    @property
    def in_step(self) -> bool:
        return self._plan is not None

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._finished_outside_step)

    def add(self, req: EngineRequest) -> None:
        if req.id in self._by_id:
            raise ValueError(f"request {req.id!r} already in the engine")
        self._by_id[req.id] = req
        self.waiting.append(req)

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

    def begin_step(self) -> float | None:
        """Plan the next step and return its duration, or None when there is nothing to do."""
        if self._plan is not None:
            raise RuntimeError("begin_step called twice without end_step")
        decode = self._make_decode_room()
        admitted = self._admit()
        if not decode and not admitted:
            return 0.0 if self._finished_outside_step else None
        prefill_tokens = sum(r.context for r in admitted)
        context = sum(r.context for r in decode)
        duration = self.step_model.step_time(prefill_tokens, len(decode), context, len(admitted))
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
            if not req.ever_started:
                req.ever_started = True
                report.started[req.id] = req.prompt_tokens
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
        return report

    # ------------------------------------------------------------ internals

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _make_decode_room(self) -> list[EngineRequest]:
        """Grow every running request by one token's KV; preempt (or stall) the newest if it can't."""
        self._preempted_last = 0
        extra = [self._blocks_for(r.context + 1) - r.blocks for r in self.running]
        free = self.total_blocks - self.used_blocks
        shortfall = sum(extra) - free
        decode = list(self.running)
        if shortfall > 0:
            if self.preemption:
                while shortfall > 0 and decode:
                    victim = decode.pop()
                    shortfall -= extra[len(decode)] + victim.blocks
                    self.used_blocks -= victim.blocks
                    victim.blocks = 0
                    self.running.remove(victim)
                    self.waiting.appendleft(victim)
                    self._preempted_last += 1
                extra = extra[: len(decode)]
            else:
                while shortfall > 0 and decode:
                    decode.pop()
                    shortfall -= extra.pop()
        for req, add in zip(decode, extra, strict=True):
            req.blocks += add
            self.used_blocks += add
        return decode

    def _admit(self) -> list[EngineRequest]:
        admitted: list[EngineRequest] = []
        limit = self.max_running
        while self.waiting and (limit is None or len(self.running) < limit):
            req = self.waiting[0]
            if req.aborted:
                self.waiting.popleft()
                self._forget(req, "abort", self._finished_outside_step)
                continue
            blocks = self._blocks_for(req.context + 1)
            if blocks > self.total_blocks - self.used_blocks:
                break
            self.waiting.popleft()
            req.blocks = blocks
            self.used_blocks += blocks
            self.running.append(req)
            admitted.append(req)
        return admitted

    def _forget(self, req: EngineRequest, reason: str, into: list[FinishedRequest]) -> None:
        self.used_blocks -= req.blocks
        req.blocks = 0
        self._by_id.pop(req.id, None)
        into.append(FinishedRequest(req.id, req.generated, reason))
