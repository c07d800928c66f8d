"""vLLM behind the worker interface: ``AsyncLLM`` (v1 engine) with delta outputs.

Per-step reports: a stat logger receives vLLM's scheduler stats once per engine step, after that
step's outputs were handed to the per-request streams. It schedules a flush with ``call_soon``, which
runs after the request streams woken by that step have recorded their new tokens, so one report
carries the step's new tokens per request, the requests that started (with the engine's exact prompt
token counts and its prefix-cache hits, vLLM's ``num_cached_tokens``), those that finished, free KV
tokens (from vLLM's KV usage: blocks × block size), and the running and waiting counts. The
dispatcher assigns by vLLM's own admission rule (its prompt fits the free KV above the watermark)
plus a short queue, so vLLM's waiting queue stays short and VTC's order decides what enters it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fairgate.workers.engines.interface import (
    Delta,
    FinishedRequest,
    GenerationParams,
    KVEvent,
    StepCallback,
    StepReport,
)
from fairgate.workers.engines.vllm.kv_event_keys import KvEventKeys
from fairgate.workers.engines.vllm.settings import VllmSettings

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending:
    """Per-request events since the last report."""

    started: dict[str, int] = field(default_factory=dict)
    cached: dict[str, int] = field(default_factory=dict)
    new_tokens: dict[str, int] = field(default_factory=dict)
    finished: list[FinishedRequest] = field(default_factory=list)
    adapter_loads: dict[str, float] = field(default_factory=dict)
    kv_events: list[KVEvent] = field(default_factory=list)


WARM_UP_PROMPT_TOKENS = 32
KV_TOPIC = b"kv"


class VllmRunner:
    def __init__(self, settings: VllmSettings, served_model: str | None = None) -> None:
        self.settings = settings
        self.served_model = served_model or settings.model
        self.kv_tokens = 0
        self.block_size = 0
        self.max_running: int | None = None
        self.watermark_tokens = 0
        self.max_loras = settings.max_loras
        self.serving_models: Any = None  # vLLM's OpenAI layer's registry of models (set with its app)
        self._adapters: dict[str, str] = {}  # registered adapter -> its weights' path
        self._adapter_locks: dict[str, asyncio.Lock] = {}
        self._gpu_adapters: tuple[str, ...] = ()  # those of vLLM's running batch, as of its last step
        self._host_adapters: tuple[str, ...] = ()  # those in vLLM's host cache, as last asked
        self._ask_again = False  # asked while a read of the host cache was on its way
        self._asking: asyncio.Task[None] | None = None
        self.takes_priority = False  # vLLM runs its priority policy: requests carry the dispatcher's ranks
        self.llm: Any = None
        self._on_step: StepCallback = lambda _report: None
        self._pending = _Pending()
        self._flush_scheduled = False
        self._last_flush = time.monotonic()
        self._active: set[str] = set()  # submitted and not yet finished
        self._reached: set[str] = set()  # handed to the engine, until the worker asks
        self._engine_ids: dict[str, str] = {}  # admitted id -> the id vLLM's serving layer gave it
        self._begun: set[str] = set()  # active requests whose first output came (they started)
        # prompt tokens of active requests vLLM's scheduler has taken, seen at a step before any output:
        # vLLM forgets them when a caller leaves (its abort runs before this runner's clean-up)
        self._scheduled: dict[str, int] = {}
        self._revoked: set[str] = set()  # taken back before vLLM scheduled them: nothing to report
        self._free_blocks = 0
        self._running = 0
        self._waiting = 0
        self.steps = 0
        self.kv_keys: KvEventKeys | None = None  # vLLM's KV events in the dispatcher's terms (when on)
        self._kv_listener: asyncio.Task[None] | None = None
        self._kv_endpoint = ""

    # ------------------------------------------------------------------ lifecycle

    async def start(self, on_step: StepCallback) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        self._on_step = on_step
        os.environ.update(self.settings.cpu_environment())  # before the engine's processes start: inherited
        args = self.settings.async_engine_args(self.served_model)
        if self.settings.kv_events:
            args.kv_events_config = self._listen_to_kv_events()
        self.llm = AsyncLLM.from_engine_args(args, stat_loggers=[self._stat_logger])
        cache = self.llm.vllm_config.cache_config
        if self._kv_listener is not None:
            self.kv_keys = KvEventKeys(self.served_model, int(cache.block_size))
        usable_blocks = int(cache.num_gpu_blocks) - 1  # vLLM keeps one block aside (the null block)
        self.block_size = int(cache.block_size)
        self.kv_tokens = usable_blocks * self.block_size
        self._free_blocks = usable_blocks
        scheduler = self.llm.vllm_config.scheduler_config
        self.max_running = int(scheduler.max_num_seqs)
        # vLLM keeps int(watermark x its blocks) free when admitting beside running requests
        watermark_blocks = int(float(getattr(scheduler, "watermark", 0.0)) * int(cache.num_gpu_blocks))
        self.watermark_tokens = watermark_blocks * self.block_size
        self.takes_priority = str(getattr(scheduler, "policy", "fcfs")) == "priority"
        await self._warm_up()
        log.info("vLLM engine up: %d KV tokens in blocks of %d", self.kv_tokens, self.block_size)

    async def _warm_up(self) -> None:
        """One short generation before the first request: the first forward pass pays one-off costs,
        and on vLLM's CPU backend a first pass of a few tokens can kill the model's process (SIGILL),
        which a longer one first avoids (docs/vllm.md)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        assert self.llm is not None
        sampling = SamplingParams(max_tokens=2, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
        prompt = TokensPrompt(prompt_token_ids=list(range(1, WARM_UP_PROMPT_TOKENS + 1)))
        async for _ in self.llm.generate(prompt, sampling, request_id="fairgate-warm-up"):
            pass

    async def stop(self) -> None:
        if self._kv_listener is not None:
            self._kv_listener.cancel()
            self._kv_listener = None
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None
        if self._kv_endpoint:
            with contextlib.suppress(OSError):
                os.unlink(self._kv_endpoint.removeprefix("ipc://"))

    def _listen_to_kv_events(self) -> Any:
        """vLLM publishes its KV cache events on a ZMQ socket of this process's own (a Unix socket: no
        port, nothing on the network); a task here subscribes before the engine starts, so that no
        event is missed, and turns each into the dispatcher's terms for the next report."""
        import tempfile
        import uuid

        import zmq
        import zmq.asyncio
        from vllm.config.kv_events import KVEventsConfig

        path = os.path.join(tempfile.gettempdir(), f"fairgate-kv-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        self._kv_endpoint = f"ipc://{path}"
        socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
        socket.connect(self._kv_endpoint)
        socket.setsockopt(zmq.SUBSCRIBE, KV_TOPIC)
        self._kv_listener = asyncio.get_running_loop().create_task(self._read_kv_events(socket))
        return KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=self._kv_endpoint, topic=KV_TOPIC.decode()
        )

    async def _read_kv_events(self, socket: Any) -> None:
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        try:
            while True:
                _topic, _seq, payload = await socket.recv_multipart()
                keys = self.kv_keys
                if keys is None:  # the engine is still starting (its warm-up): nothing to key yet
                    continue
                for event in decoder.decode(payload).events:
                    self._pending.kv_events.extend(keys.translate(event))
                if self._pending.kv_events:
                    self._schedule_flush()
        except asyncio.CancelledError:
            pass
        except Exception:  # the index falls back to its model of the cache: worth a line, not a crash
            log.exception("vLLM's KV events: the listener stopped")
        finally:
            socket.close(linger=0)

    def _stat_logger(self, vllm_config: Any, engine_index: int = 0) -> Any:
        from fairgate.workers.engines.vllm.step_logger import StepLogger

        return StepLogger(self._on_engine_step)

    # ------------------------------------------------------------------ interface

    def free_tokens(self) -> int:
        if not self._active:  # nothing running: vLLM has freed every block (cached ones count as free)
            return self.kv_tokens
        return self._free_blocks * self.block_size

    def has_work(self) -> bool:
        return bool(self._active)

    @property
    def running(self) -> int:
        """Requests vLLM is running, as of its last step."""
        return self._running if self._active else 0

    def healthy(self) -> bool:
        return self.llm is not None and not self.llm.errored

    def abort(self, request_id: str) -> None:
        if request_id in self._active and self.llm is not None:
            engine_id = self._engine_ids.get(request_id, request_id)
            asyncio.get_running_loop().create_task(self.llm.abort(engine_id))

    def revoke(self, request_id: str) -> bool:
        """Take back a request vLLM holds in its waiting queue: no output yet and its scheduler has not
        taken it (its prefill not begun). Aborted in the engine; its stream ends without a report."""
        if request_id not in self._active or request_id in self._begun or self.llm is None:
            return False
        engine_id = self._engine_ids.get(request_id, request_id)
        if request_id in self._scheduled or self.scheduled_prompt_tokens(engine_id):
            return False
        self._revoked.add(request_id)
        asyncio.get_running_loop().create_task(self.llm.abort(engine_id))
        return True

    async def generate(self, request_id: str, params: GenerationParams) -> AsyncIterator[Delta]:
        """Profiling and benchmarks drive the engine directly (no OpenAI layer): deltas of the text."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        sampling = SamplingParams(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            stop=list(params.stop) or None,
            ignore_eos=params.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
        )
        if isinstance(params.prompt, str):
            prompt: Any = params.prompt
            tokenization = {"add_special_tokens": False} if params.templated else None
        else:
            prompt, tokenization = TokensPrompt(prompt_token_ids=list(params.prompt)), None
        stream = self.llm.generate(prompt, sampling, request_id, tokenization_kwargs=tokenization)
        generated = 0
        async for out in self.tracked(request_id, stream, 1):
            completion = out.outputs[0] if out.outputs else None
            generated += len(completion.token_ids) if completion is not None else 0
            reason = _finish_reason(completion.finish_reason if completion is not None else None, out.finished)
            prompt_tokens = len(out.prompt_token_ids or ())
            yield Delta(completion.text if completion is not None else "", generated, prompt_tokens, reason)
            if reason is not None:
                return

    async def tracked(self, request_id: str, stream: AsyncIterator[Any], choices: int) -> AsyncIterator[Any]:
        """vLLM's delta outputs of one request, counted for the per-step reports as they pass: its
        exact prompt tokens when it starts (``choices`` sequences each hold the prompt), the output
        tokens of every sequence, and how it finished. Closing early aborts it in the engine."""
        self._active.add(request_id)
        self._reached.add(request_id)
        prompt_tokens = generated = 0
        finished = False
        try:
            async for out in stream:
                if request_id in self._revoked:  # taken back: until vLLM's abort output, nothing is counted
                    yield out
                    continue
                pending = self._pending
                self._begun.add(request_id)
                if not prompt_tokens:
                    prompt_tokens = len(out.prompt_token_ids or ()) * choices
                    pending.started[request_id] = prompt_tokens
                    pending.cached[request_id] = int(getattr(out, "num_cached_tokens", 0) or 0) * choices
                k = sum(len(c.token_ids) for c in out.outputs)
                if k:
                    generated += k
                    pending.new_tokens[request_id] = pending.new_tokens.get(request_id, 0) + k
                if out.finished:
                    finished = True
                    reasons = [c.finish_reason for c in out.outputs]
                    self._finish(request_id, generated, _finish_reason(reasons[0] if reasons else None, True) or "stop")
                yield out
        finally:
            self._begun.discard(request_id)
            if request_id in self._revoked:  # taken back: the worker reported it, vLLM drops it
                self._revoked.discard(request_id)
                self._active.discard(request_id)
                finished = True
            if not finished:  # the caller left (or the engine failed): stop generating now
                if not prompt_tokens:  # prefilled, though no output reached us: the prompt stays charged
                    engine_id = self._engine_ids.get(request_id, request_id)
                    seen = self.scheduled_prompt_tokens(engine_id) or self._scheduled.get(request_id, 0)
                    scheduled = seen * choices
                    if scheduled:
                        self._pending.started[request_id] = scheduled
                if self.llm is not None:
                    await self.llm.abort(self._engine_ids.get(request_id, request_id))
                self._finish(request_id, generated, "abort")
            self._engine_ids.pop(request_id, None)
            self._scheduled.pop(request_id, None)

    async def prepare_adapter(self, name: str, path: str) -> None:
        """Register the adapter with vLLM's serving layer once (again when its path changed), as its
        ``/v1/load_lora_adapter`` would: vLLM reads the weights into its host cache now and moves them
        to the GPU when a batch needs them, evicting the least recently used (``max_loras``,
        ``max_cpu_loras``). The registration's time is reported as the adapter's load."""
        if self._adapters.get(name) == path:
            return
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest

        async with self._adapter_locks.setdefault(name, asyncio.Lock()):
            if self._adapters.get(name) == path:
                return
            began = time.monotonic()
            request = LoadLoRAAdapterRequest(lora_name=name, lora_path=path, load_inplace=name in self._adapters)
            result = await self.serving_models.load_lora_adapter(request)
            if not isinstance(result, str):  # vLLM's ErrorResponse
                raise RuntimeError(result.error.message)
            self._adapters[name] = path
            self._pending.adapter_loads[name] = self._pending.adapter_loads.get(name, 0.0) + time.monotonic() - began
            self._schedule_flush()
            self._ask_host_cache()

    def _ask_host_cache(self) -> None:
        """Which adapters vLLM's host cache holds (``max_cpu_loras``, least recently used evicted), asked
        in the background after a registration and whenever a step runs an adapter it is not known to
        hold; one back in it after an eviction counts as a load (its time is not known). Asked while a
        read is on its way, it reads again after it: that read may predate the load."""
        if self._asking is None or self._asking.done():
            self._asking = asyncio.get_running_loop().create_task(self._read_host_cache())
        else:
            self._ask_again = True

    async def _read_host_cache(self) -> None:
        self._ask_again = True
        while self._ask_again:
            self._ask_again = False
            held = await self.llm.list_loras()
            named = self.serving_models.lora_requests
            now = tuple(name for name, r in named.items() if r.lora_int_id in held)
            for name in set(now) - set(self._host_adapters) - set(self._pending.adapter_loads):
                self._pending.adapter_loads[name] = 0.0
            self._host_adapters = now
            self._schedule_flush()

    def pop_reached(self, request_id: str) -> bool:
        if request_id in self._reached:
            self._reached.discard(request_id)
            return True
        return False

    async def openai_app(self) -> Any:
        """vLLM's own OpenAI server app over this engine (as ``vllm serve`` builds it, with the
        settings' ``serve_args``); its generations go through ``AccountedEngine``."""
        from fairgate.workers.engines.vllm.openai_layer import build_vllm_app

        return await build_vllm_app(self)

    def scheduled_prompt_tokens(self, request_id: str) -> int:
        """The prompt's tokens once vLLM's scheduler has taken the request (its prefill is under way or
        done), else 0. A caller that leaves between the prefill and the first output must not get the
        prompt back: the GPU did that work."""
        processor = getattr(self.llm, "output_processor", None)
        states = getattr(processor, "request_states", {})
        state = states.get(request_id)  # by vLLM's internal id, else by the serving layer's (external)
        for internal in () if state is not None else getattr(processor, "external_req_ids", {}).get(request_id, ()):
            state = states.get(internal)
            break
        stats = getattr(state, "stats", None)
        return int(state.prompt_len) if stats is not None and stats.scheduled_ts else 0

    # ------------------------------------------------------------------ per-step reports

    def _finish(self, request_id: str, generated: int, reason: str) -> None:
        if request_id in self._active:
            self._active.discard(request_id)
            self._pending.finished.append(FinishedRequest(request_id, generated, reason))
            self._schedule_flush()  # an abort may come while the engine is idle: report it anyway

    def _on_engine_step(self, free_fraction: float, running: int, waiting: int, adapters: tuple[str, ...]) -> None:
        """Called by vLLM's output loop once per engine step, after the step's outputs were queued."""
        self.steps += 1
        if len(self._begun) < len(self._active):  # some have no output yet: has the scheduler taken them
            for rid in self._active - self._begun - self._scheduled.keys():
                if n := self.scheduled_prompt_tokens(self._engine_ids.get(rid, rid)):
                    self._scheduled[rid] = n
        self._gpu_adapters = adapters
        if adapters and not set(adapters) <= set(self._host_adapters):  # one was loaded for this step
            self._ask_host_cache()
        self._free_blocks = round(free_fraction * (self.kv_tokens // max(1, self.block_size)))
        self._running, self._waiting = running, waiting
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, _Pending()
        now = time.monotonic()
        report = StepReport(
            duration_s=now - self._last_flush,
            started=pending.started,
            cached=pending.cached,
            new_tokens=pending.new_tokens,
            finished=pending.finished,
            free_tokens=self.free_tokens(),
            running=self._running if self._active else 0,
            waiting=self._waiting if self._active else 0,
            adapters=self._gpu_adapters if self._active else (),
            host_adapters=self._host_adapters,
            adapter_loads=pending.adapter_loads,
            kv_events=pending.kv_events,
        )
        self._last_flush = now
        self._on_step(report)


def _finish_reason(reason: str | None, finished: bool) -> str | None:
    if not finished:
        return None
    return reason if reason in ("stop", "length", "abort") else "stop"
