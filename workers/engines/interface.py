"""The engine contract: what a worker replica drives, what an engine reports each step, and the plug-in
through which the rest of the gateway learns what it needs of an engine (docs/architecture.md, "engines are
plug-ins"). Nothing outside ``workers/`` branches on which engine it is: it asks the plug-in.

- ``EngineRunner``: one engine behind a worker replica. The worker shell (``fairgate.workers.worker``) owns the
  gRPC parts: it checks tickets, enforces what they admitted, relays the engine's response bytes to the
  ingress and sends one report per engine step to the dispatcher; a runner turns a request into a
  stream of deltas, calls ``on_step`` once per engine step with what that step did (a ``StepReport``),
  and serves the engine's own OpenAI layer (``openai_app``: an ASGI app the worker drives in-process).
  The layer learns which admitted request it serves from ``current_grant``.
- ``PromptEstimator``: the ingress turns a request into the engine's prompt and counts its tokens, as
  the engine will, before the dispatcher charges them.
- ``EnginePlugin``: validates the engine's settings and builds its runner and prompt estimator; says
  its context limit, its capacity before a replica reports one, and the model it serves.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from fairgate.core.registry import Param
from fairgate.workers.engine_alone import engine_alone

ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Awaitable[None]]],
    Awaitable[None],
]


@dataclass(frozen=True, slots=True)
class TicketGrant:
    """The request the worker admitted under a ticket: the engine's request id (reports, aborts) and
    the tenant's prefix-cache salt. Set in ``current_grant`` while the OpenAI layer serves it."""

    request_id: str
    tenant: str
    cache_salt: str = ""
    priority: int = 0  # the dispatcher's preemption rank (larger: preempted first)
    adapter: str = ""  # the LoRA adapter the ticket names ("": the base model)
    adapter_path: str = ""  # where its weights are
    cache_group: str = ""  # whose salt ``cache_salt`` is: the tenant's sharing group, else the tenant


current_grant: ContextVar[TicketGrant | None] = ContextVar("fairgate_grant", default=None)


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
    cache_salt: str = ""  # the prefix cache keeps prompts of different salts apart
    priority: int = 0  # the engine's preemption rank, where it takes one (larger: preempted first)
    adapter: str = ""  # the LoRA adapter it is served with ("": the base model)
    cache_group: str = ""  # whose salt ``cache_salt`` is (its engine's KV events are keyed by it)


@dataclass(slots=True)
class Delta:
    """New output since the previous delta. Token counts are totals; ``finish_reason`` ends the stream."""

    text: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str | None = None
    cached_tokens: int = 0  # of the prompt, found in the engine's prefix cache (reported in usage)


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    id: str
    output_tokens: int
    reason: str  # "stop", "length" or "abort"


KVEvent = tuple[str, str, tuple[int, ...]]
"""What an engine's KV cache did, as vLLM publishes it: ("stored" | "removed" | "cleared", the medium
("GPU", "CPU": host memory, "SHARED": a store all engines share), the blocks' hashes, in the
dispatcher's terms: the prompt block hashes it sent, ``fairgate.common.prefix_hashes``)."""


@dataclass(slots=True)
class StepReport:
    """What one engine step did: the per-step report a worker sends to the dispatcher."""

    duration_s: float
    started: dict[str, int] = field(default_factory=dict)  # id -> exact prompt tokens
    cached: dict[str, int] = field(default_factory=dict)  # id -> prompt tokens found in the prefix cache at start
    new_tokens: dict[str, int] = field(default_factory=dict)  # id -> output tokens this step
    finished: list[FinishedRequest] = field(default_factory=list)
    free_tokens: int = 0
    running: int = 0
    waiting: int = 0
    preempted: int = 0  # requests the engine preempted for room (the simulated engine counts them)
    adapters: tuple[str, ...] = ()  # LoRA adapters loaded on the GPU after the step, least recently used first
    host_adapters: tuple[str, ...] = ()  # and those cached in host memory
    adapter_loads: dict[str, float] = field(default_factory=dict)  # adapter -> seconds its loads took this step
    kv_events: list[KVEvent] = field(default_factory=list)  # what the KV cache stored and evicted this step

    def merged(self, later: StepReport) -> StepReport:
        """This step's report and ``later``'s as one, as a worker sends the steps within its report pace:
        what happened in either, the engine's state after the later one."""
        new_tokens = dict(self.new_tokens)
        for rid, k in later.new_tokens.items():
            new_tokens[rid] = new_tokens.get(rid, 0) + k
        loads = dict(self.adapter_loads)
        for name, seconds in later.adapter_loads.items():
            loads[name] = loads.get(name, 0.0) + seconds
        return StepReport(
            self.duration_s + later.duration_s,
            started={**self.started, **later.started},
            cached={**self.cached, **later.cached},
            new_tokens=new_tokens,
            finished=[*self.finished, *later.finished],
            free_tokens=later.free_tokens,
            running=later.running,
            waiting=later.waiting,
            preempted=self.preempted + later.preempted,
            adapters=later.adapters,
            host_adapters=later.host_adapters,
            adapter_loads=loads,
            kv_events=[*self.kv_events, *later.kv_events],
        )


StepCallback = Callable[[StepReport], None]


class EngineRunner(Protocol):
    """One engine behind a worker replica."""

    kv_tokens: int  # KV pool in tokens
    block_size: int
    max_running: int | None
    watermark_tokens: int  # KV kept free when admitting beside running requests (the engine's own rule)
    max_loras: int | None  # LoRA adapters its batch holds at once (None: it serves none)

    def free_tokens(self) -> int: ...

    async def start(self, on_step: StepCallback) -> None: ...

    def generate(self, request_id: str, params: GenerationParams) -> AsyncIterator[Delta]:
        """Deltas until one carries a finish reason. Closing the iterator early aborts the request."""
        ...

    def abort(self, request_id: str) -> None:
        """Stop a request; its stream ends with a delta whose finish reason is "abort"."""
        ...

    def revoke(self, request_id: str) -> bool:
        """Take back a request the engine holds but has not started: True when it never will (its
        stream ends without output and no report says it finished: the worker says so); False when it
        started or is not here."""
        ...

    def has_work(self) -> bool: ...

    def healthy(self) -> bool:
        """False once the engine has failed for good (the replica is then replaced)."""
        ...

    async def openai_app(self) -> ASGIApp:
        """The engine's own OpenAI layer over this runner (after ``start``): ``/v1/chat/completions`` and
        ``/v1/completions``. Every generation it starts uses ``current_grant``'s request id."""
        ...

    async def prepare_adapter(self, name: str, path: str) -> None:
        """Make the LoRA adapter ``name`` (weights at ``path``) servable under that model name before a
        request for it goes to the OpenAI layer; the engine loads it onto its GPU when a batch needs it."""
        ...

    def pop_reached(self, request_id: str) -> bool:
        """Whether a generation under this id was handed to the engine (forgotten once asked): a request
        the layer refused before that never reached it, and the worker settles it as aborted."""
        ...

    async def stop(self) -> None: ...


class PromptEstimator(Protocol):
    """The engine's prompt for a request, and its token count, as the engine will see them."""

    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The chat template applied to the messages (and tools), ending with the assistant's turn."""
        ...

    def count(self, text: str, templated: bool) -> int:
        """Prompt tokens of ``text`` (a templated prompt already carries its special tokens)."""
        ...

    def tokens(self, text: str, templated: bool) -> list[int]:
        """The token ids of ``text``, as ``count`` counts them (for the prompt's prefix hashes)."""
        ...


Settings = dict[str, Any]  # an engine's validated settings, as plain data (they travel through Ray)


class EnginePlugin:
    """Everything the gateway needs to know of one engine; one subclass per engine sub-package,
    registered with ``fairgate.workers.engines.register``."""

    name: ClassVar[str]
    # Its parameters are its settings (the ``workers`` section's keys beyond the replicas' own, or its
    # ``settings_section`` there), checked by ``settings_model``; the registry's own list stays empty.
    params: ClassVar[tuple[Param, ...]] = ()
    serves_models: ClassVar[bool] = False  # the command line's --model picks an engine that does
    uses_gpus: ClassVar[bool] = False  # each replica takes a GPU where the cluster has them
    default_replicas: ClassVar[int | None] = None  # replicas when chosen on the command line (None: the config's)

    def settings(self, raw: Mapping[str, Any]) -> Settings:
        """Validate the engine's settings (the config's ``workers`` section beyond its own keys);
        raises ``ValueError`` naming the field. Returns them as plain data."""
        raise NotImplementedError

    def override(self, settings: Settings, *, model: str | None = None, kv_tokens: int | None = None) -> Settings:
        """The settings with the command line's ``--model`` / ``--kv-tokens`` applied."""
        raise NotImplementedError

    def runner(self, settings: Settings, served_model: str | None = None) -> EngineRunner:
        """The engine of one replica; ``served_model``: the name its OpenAI layer answers to."""
        raise NotImplementedError

    def prompts(self, settings: Settings) -> PromptEstimator:
        raise NotImplementedError

    def context_limit(self, settings: Settings) -> int | None:
        """The longest prompt plus output the engine takes, when known before it starts."""
        return None

    def block_size(self, settings: Settings) -> int:
        """Tokens per KV block of the engine's prefix cache (what the ingress hashes prompts by)."""
        return 16

    def serves_adapters(self, settings: Settings) -> bool:
        """Whether these settings give the engine LoRA adapter slots (adapters may name this model)."""
        return False

    def capacity(self, settings: Settings) -> tuple[int, int | None]:
        """KV tokens and batch limit of one replica, used before replicas report their own."""
        raise NotImplementedError

    def served_model(self, settings: Settings) -> str | None:
        """The model name the engine serves, when the engine decides it (None: the config's)."""
        return None

    reference_name: ClassVar[str] = "engine layer alone"
    # the pydantic model of its settings and where they sit under ``workers`` ("": beside the generic
    # keys), for the configuration reference (docs/configuration.md)
    settings_model: ClassVar[type | None] = None
    settings_section: ClassVar[str] = ""
    # the titles of the engine's own processes (its step loop and the model; none: it runs inside the
    # worker), for benchmarks that give them cores of their own, as a GPU host gives its engine a device
    # and the cores that feed it (``fairgate.loadgen.cpu_split``)
    engine_process_titles: ClassVar[tuple[str, ...]] = ()

    def reference_server(
        self, settings: Settings, served_model: str, port: int, log: Any = None
    ) -> contextlib.AbstractContextManager[str]:
        """The engine served alone on 127.0.0.1:``port``, as users run it without fairgate: what
        fairgate's answers and speed are compared with. A context manager yielding its ``.../v1`` URL;
        by default this engine's own OpenAI layer under uvicorn (``fairgate.workers.engine_server``)."""
        return engine_alone(self.name, settings, served_model, port, log)

    def benchmark_settings(self, options: Mapping[str, Any]) -> tuple[Settings, str]:
        """(raw settings, model name) for ``fairgate bench openai`` from its options (``model``,
        ``kv_tokens``, ``max_num_seqs``, ``cpu_threads``, ``step_ms``; each engine takes what it has)."""
        raise NotImplementedError
