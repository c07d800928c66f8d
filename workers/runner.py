"""The engine interface every worker replica drives: the simulated engine and vLLM implement it.

The worker shell (``workers.worker``) owns the gRPC parts: it checks tickets, streams deltas to the
ingress and sends one report per engine step to the dispatcher. A runner owns one engine: it turns a
request into a stream of deltas and calls ``on_step`` once per engine step with what that step did.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from workers.engine.simulated import StepReport


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """What the ingress asked for. ``prompt`` is text, or token ids (profiling drives exact lengths)."""

    prompt: str | list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    templated: bool = False  # a chat template was applied: tokenize without adding special tokens


@dataclass(slots=True)
class Delta:
    """New output since the previous delta. Token counts are totals; ``finish_reason`` ends the stream."""

    text: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str | None = None


StepCallback = Callable[[StepReport], None]


class EngineRunner(Protocol):
    """One engine behind a worker replica."""

    kv_tokens: int  # KV pool in tokens
    block_size: int
    max_running: int | None

    def free_tokens(self) -> int: ...

    async def start(self, on_step: StepCallback) -> None: ...

    def generate(self, request_id: str, params: GenerationParams) -> AsyncIterator[Delta]:
        """Deltas until one carries a finish reason. Closing the iterator early aborts the request."""
        ...

    def abort(self, request_id: str) -> None:
        """Stop a request; its stream ends with a delta whose finish reason is "abort"."""
        ...

    def has_work(self) -> bool: ...

    def healthy(self) -> bool:
        """False once the engine has failed for good (the replica is then replaced)."""
        ...

    async def stop(self) -> None: ...
