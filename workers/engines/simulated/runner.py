"""The shared engine model run in real time: each step sleeps for its modelled duration.

Text comes from the simulated tokenizer, one word per token, so the ingress (which counts prompts with
the same tokenizer) and the engine agree exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fairgate.common.prefix_hashes import block_hashes, for_adapter, hash_block_tokens, salted
from fairgate.core.reasons import FINISH_REVOKED
from fairgate.workers.engines.interface import ASGIApp, Delta, GenerationParams, KVEvent, StepCallback, StepReport
from fairgate.workers.engines.simulated.model import EngineRequest, SimulatedEngine
from fairgate.workers.engines.simulated.tokenizer import natural_length, stable_seed, token_ids, token_text

CACHE_BLOCK_TOKENS = 16


MAX_KEYS = 1_000_000


class SimulatedRunner:
    def __init__(self, engine: SimulatedEngine, served_model: str = "") -> None:
        self.engine = engine
        self.served_model = served_model
        # the engine's KV events name its own block hashes; the dispatcher's keys are the ingress's
        # (``fairgate.common.prefix_hashes``: the served model's name, a coarser stride, the group's salt): each
        # request's blocks that end a stride are mapped to those keys when it is added
        self._keys: dict[int, int] = {}
        self.stride = hash_block_tokens(engine.block_size)
        self.kv_tokens = engine.kv_tokens
        self.block_size = engine.block_size
        # the prefix cache's unit: whole KV blocks of at least 16 tokens, as vLLM's GPU blocks
        self.cache_block = engine.block_size * -(-CACHE_BLOCK_TOKENS // engine.block_size)
        self.max_running = engine.max_running
        self.watermark_tokens = engine.watermark_tokens
        self.max_loras = engine.adapters.settings.max_loras if engine.adapters is not None else None
        self._queues: dict[str, asyncio.Queue[tuple[int, str | None]]] = {}
        self._cached: dict[str, int] = {}  # prompt tokens found cached, for requests whose start is not yet read
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._on_step: StepCallback = lambda _report: None
        self._reached: set[str] = set()  # generations handed to the engine, until the worker asks

    def free_tokens(self) -> int:
        return self.engine.free_tokens

    def has_work(self) -> bool:
        return self.engine.has_work() or bool(self._queues)

    def healthy(self) -> bool:
        return self._task is None or not self._task.done()

    def abort(self, request_id: str) -> None:
        if self.engine.abort(request_id):
            self._wake.set()

    def revoke(self, request_id: str) -> bool:
        queue = self._queues.get(request_id)
        if queue is None or not self.engine.revoke(request_id):
            return False
        queue.put_nowait((0, FINISH_REVOKED))
        del self._queues[request_id]  # its stream's end aborts nothing: the engine no longer has it
        return True

    async def openai_app(self) -> ASGIApp:
        from fairgate.workers.engines.simulated.openai_layer import build_openai_app

        return build_openai_app(self)

    async def prepare_adapter(self, name: str, path: str) -> None:
        """Nothing to register: the engine model loads an adapter when a batch needs it."""

    def pop_reached(self, request_id: str) -> bool:
        if request_id in self._reached:
            self._reached.discard(request_id)
            return True
        return False

    async def start(self, on_step: StepCallback) -> None:
        self._on_step = on_step
        self._task = asyncio.create_task(self._loop(), name="simulated-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def generate(self, request_id: str, params: GenerationParams) -> AsyncIterator[Delta]:
        if isinstance(params.prompt, str):
            prompt_text = params.prompt
            tokens = token_ids(prompt_text)
        else:
            prompt_text = " ".join(map(str, params.prompt))
            tokens = list(params.prompt)
        prompt_tokens = len(tokens)
        block = self.cache_block
        prefix = block_hashes(tokens, block, params.cache_salt) if self.engine.prefix_caching else ()
        prefix = for_adapter(prefix, params.adapter)  # a prefix under one adapter is no hit under another
        if self.engine.kv_events and prefix and params.cache_group:
            self._map_keys(tokens, prefix, params)
        seed = params.seed if params.seed is not None else stable_seed(request_id)
        target = params.max_tokens if params.ignore_eos else min(params.max_tokens, natural_length(prompt_text, seed))
        queue: asyncio.Queue[tuple[int, str | None]] = asyncio.Queue()
        self._queues[request_id] = queue
        if len(self._reached) > 100_000:  # the worker asks after each request; bounded regardless
            self._reached.clear()
        self._reached.add(request_id)
        self.engine.add(
            EngineRequest(
                request_id,
                prompt_tokens,
                params.max_tokens,
                target,
                prefix=prefix,
                prefix_block=block,
                priority=params.priority,
                adapter=params.adapter,
            )
        )
        self._wake.set()
        generated = cached = 0
        try:
            while True:
                k, reason = await queue.get()
                cached = self._cached.pop(request_id, cached)
                if k:
                    text = "".join(token_text(seed, generated + i) for i in range(k))
                    generated += k
                    yield Delta(text, generated, prompt_tokens, cached_tokens=cached)
                if reason is not None:
                    yield Delta("", generated, prompt_tokens, reason, cached)
                    return
        finally:
            self._cached.pop(request_id, None)
            if self._queues.pop(request_id, None) is not None:
                self.engine.abort(request_id)
                self._wake.set()

    async def _loop(self) -> None:
        engine = self.engine
        while True:
            duration = engine.begin_step()
            if duration is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(duration)
            report = engine.end_step()
            if report.kv_events:
                report.kv_events = self._translate(report.kv_events)
            self._deliver(report)
            self._on_step(report)

    def _map_keys(self, tokens: list[int], prefix: tuple[int, ...], params: GenerationParams) -> None:
        """Which of ``prefix``'s engine blocks end a stride of the dispatcher's, and its key there."""
        if self.stride % self.cache_block:
            return
        per = self.stride // self.cache_block
        raw = block_hashes(tokens, self.stride, self.served_model)
        keys = salted(for_adapter(raw, params.adapter), params.cache_group)
        if len(self._keys) > MAX_KEYS:
            self._keys.clear()
        for k, key in enumerate(keys):
            end = (k + 1) * per - 1
            if end < len(prefix):
                self._keys[prefix[end]] = key

    def _translate(self, events: list[KVEvent]) -> list[KVEvent]:
        """The engine's events in the dispatcher's keys (blocks that end no stride are left out)."""
        out: list[KVEvent] = []
        keys = self._keys
        for kind, medium, hashes in events:
            if kind == "removed":
                mapped = tuple(k for h in hashes if (k := keys.pop(h, None)) is not None)
            else:
                mapped = tuple(keys[h] for h in hashes if h in keys)
            if mapped or kind == "cleared":
                out.append((kind, medium, mapped))
        return out

    def _deliver(self, report: StepReport) -> None:
        for rid, cached in report.cached.items():
            if rid in self._queues:
                self._cached[rid] = cached
        for rid, k in report.new_tokens.items():
            queue = self._queues.get(rid)
            if queue is not None:
                queue.put_nowait((k, None))
        for done in report.finished:
            queue = self._queues.pop(done.id, None)
            if queue is not None:
                queue.put_nowait((0, done.reason))
