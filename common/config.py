"""The gateway's configuration as typed data: every section of the one YAML file, and the whole
(``GatewayConfig``). Each process reads its own sections of it, typed, as they came from the file
(the configuration travels through Ray as it is). Checking a file against these models, and what
needs the engines or the core to check, is ``fairgate.gateway.config_schema``'s; the reference page of
every key (``docs/configuration.md``) is generated from them.

Tenant identity and weight come only from here (and the admin API): the ingress maps an API key's hash
to a tenant; no header or body field a client sends can change who it is or how much it weighs.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, InstanceOf, field_validator, model_validator

from fairgate.common.frame_guard import DEFAULT_MAX_BODY_BYTES
from fairgate.common.key_hashing import KeyHasher
from fairgate.common.sections import OpenSection, Section
from fairgate.common.tenant_schema import AdapterConfig, ClassConfig, NodeConfig, TenantConfig
from fairgate.core import SchedulerConfig
from fairgate.core.quotas import Prices, QuotaRule


class LimitsSettings(Section):
    """Caps on requests waiting in the dispatcher (None: no cap)."""

    max_queued_per_tenant: int | None = Field(None, ge=1, description="requests one tenant may have waiting")
    max_queued: int | None = Field(None, ge=1, description="requests all tenants together may have waiting")
    max_queue_s: float | None = Field(None, gt=0, description="a request still waiting this long is withdrawn")


class CostSettings(Section):
    """The cost of a request's tokens, what fairness counts: ``linear`` (``w_p`` per prompt token,
    ``w_q`` per output token, ``w_c`` per prompt token found in the engine's prefix cache; None: a tenth
    of ``w_p``) or ``profiled`` (five coefficients of the fitted engine time h(x, y) = a·x + b·y + c·x·y +
    d·y² + e, None: the paper's fit; ``cached_fraction`` of a cached prompt token's per-token term)."""

    kind: Literal["linear", "profiled"] = Field("linear", description="the cost function's form")
    w_p: float = Field(1.0, ge=0, description="linear: cost of a prompt token")
    w_q: float = Field(2.0, ge=0, description="linear: cost of an output token")
    w_c: float | None = Field(None, ge=0, description="linear: cost of a cached prompt token (none: w_p / 10)")
    coeffs: list[float] | None = Field(
        None, min_length=5, max_length=5, description="profiled: a, b, c, d, e of h (none: the paper's fit)"
    )
    cached_fraction: float | None = Field(
        None, ge=0, le=1, description="profiled: share of its per-token term a cached prompt token costs"
    )


_SCHEDULER_DEFAULTS = SchedulerConfig()  # one default per setting: the core's


class SchedulerSettings(Section):
    """How the dispatcher orders and places requests (top-level keys of the configuration).
    ``policy`` and ``placement``: plug-ins, named with their parameters (``vtc``, ``rpm:60``,
    ``{name: vtc-locality, slack: 500}``, ``prefix-affinity``); ``strict_head_of_line``: when the next request
    fits no worker, wait for it (true) or let up to 16 others' requests go first; ``max_engine_waiting``:
    requests that may wait inside one engine beyond its room (0: none); ``overcommit``: the pools'
    worth of expected use the requests in flight on one worker may reach; ``objective_reserve``: the
    share of each engine's KV only urgent requests (of classes that enforce their objective) start into;
    ``revoke``: take back requests engines hold unstarted from tenants more served than one that waits
    with nowhere to go (revocation by over-service)."""

    policy: str | dict[str, Any] = Field(
        _SCHEDULER_DEFAULTS.policy, description="the fairness policy: a plug-in spec ([plug-ins](#plug-ins))"
    )
    placement: str | dict[str, Any] = Field(
        _SCHEDULER_DEFAULTS.placement,
        description="which worker a request starts on: a plug-in spec ([plug-ins](#plug-ins))",
    )
    cost: CostSettings = Field(default_factory=CostSettings, description="what a token costs (section below)")
    strict_head_of_line: bool = Field(
        _SCHEDULER_DEFAULTS.strict_head_of_line, description="a next request that fits nowhere waits, no one passes it"
    )
    max_engine_waiting: int = Field(
        _SCHEDULER_DEFAULTS.max_engine_waiting, ge=0, description="requests that may wait inside one engine (0: none)"
    )
    overcommit: float = Field(
        _SCHEDULER_DEFAULTS.overcommit, ge=1, description="KV pools' worth of expected use in flight on one worker"
    )
    objective_reserve: float = Field(
        _SCHEDULER_DEFAULTS.objective_reserve,
        ge=0,
        lt=1,
        description="share of each engine's KV kept for requests of classes that enforce ttft_s (while any does)",
    )
    revoke: bool = Field(
        _SCHEDULER_DEFAULTS.revoke,
        description="take back requests engines hold unstarted for a less served tenant that waits (revocation)",
    )
    limits: LimitsSettings = Field(
        default_factory=lambda: LimitsSettings(), description="caps on waiting requests (section below)"
    )


class AutoscalingSettings(Section):
    """Replicas follow the dispatcher's demand between ``min_replicas`` (0: scale to zero) and
    ``max_replicas``; a change must be wanted for ``upscale_delay_s`` / ``downscale_delay_s`` first."""

    min_replicas: int = Field(1, ge=0, description="fewest replicas (0: scale to zero)")
    max_replicas: int = Field(4, ge=1, description="most replicas")
    upscale_delay_s: float = Field(3.0, ge=0, description="how long more replicas must be wanted before one is added")
    downscale_delay_s: float = Field(30.0, ge=0, description="how long fewer must be wanted before one drains")
    target_utilization: float = Field(0.8, gt=0, le=1, description="share of the pool's KV the demand should fill")

    @model_validator(mode="after")
    def _ordered(self) -> AutoscalingSettings:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})")
        return self


class WorkerSettings(Section):
    """The worker replicas. ``settings``: the engine's own settings (e.g. ``kv_tokens`` and
    ``step_model`` of the simulated engine, the ``vllm`` section), validated by the engine plug-in."""

    count: int = Field(2, ge=0, description="replicas, when not autoscaled")
    engine: str = Field("simulated", description="the engine plug-in: simulated or vllm")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per replica (1 for vLLM on a GPU machine)")
    num_cpus: float = Field(0.0, ge=0, description="CPUs per replica (cpu-sim on Kubernetes: 1)")
    autoscaling: AutoscalingSettings | None = Field(None, description="none: a fixed count (section below)")
    graceful_shutdown_s: float = Field(
        600.0, gt=0, description="a replica scaled down finishes what it runs within this"
    )
    settings: dict[str, Any] = Field(default_factory=dict, description="the engine's own keys, beside these")


class ModelPool(Section):
    """One model behind the endpoint: a pool of worker replicas (its engine, settings and autoscaling),
    fair within itself. ``tenants``: who may use it (None: every tenant)."""

    name: str = Field(min_length=1, description="the model name clients ask for")
    workers: WorkerSettings = Field(description="its replicas (as the workers section)")
    tenants: tuple[str, ...] | None = Field(None, description="tenants that may use it (none: every tenant)")


class IngressSettings(OpenSection):
    """The HTTP front's replicas and what it accepts."""

    replicas: int = Field(1, ge=1, description="ingress replicas")
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1, description="largest request body (413 above)")
    body_timeout_s: float = Field(30.0, gt=0, description="time a request body may take to arrive (408 after)")
    max_open_per_tenant: int = Field(
        1024, ge=1, description="HTTP requests one tenant may have open at one replica (429 above)"
    )
    default_max_tokens: int = Field(256, ge=1, description="max_tokens of a request that gives none")
    max_model_len: int = Field(4096, ge=2, description="longest prompt + output when the engine does not say")


class NetworkSettings(Section):
    """The internal endpoints' ports: 0 (the default) takes any free port, as on one machine; fixed ports
    let a NetworkPolicy name them (the Kubernetes manifests set them). Model pool N listens on the
    dispatcher's and the workers' port + N; with a fixed worker port, each Ray node runs at most one
    worker replica of a pool. Dispatcher shard N listens on the admission and rounds ports + N, and on
    the dispatcher's port + N times the pools."""

    admission_port: int = Field(0, ge=0, le=65535, description="the dispatcher's admission endpoint (from ingress)")
    dispatcher_port: int = Field(0, ge=0, le=65535, description="the dispatcher's endpoint for workers' reports")
    worker_port: int = Field(0, ge=0, le=65535, description="each worker's data plane (from ingress)")
    rounds_port: int = Field(0, ge=0, le=65535, description="each dispatcher shard's rounds endpoint (shard N: + N)")


class ShardSettings(Section):
    """Dispatcher shards (docs/shards.md): ``count`` dispatchers, each over a slice of every pool's
    workers, exchanging the tenants' counters every ``tau_s``; 1 (the default) is one dispatcher for the
    whole fleet."""

    count: int = Field(1, ge=1, le=64, description="dispatcher shards (fairgate serve --dispatchers)")
    tau_s: float = Field(0.05, gt=0, le=10, description="seconds between the shards' rounds")


class StateSettings(Section):
    """Where durable state lives: in memory (None, the default) or Redis (``FAIRGATE_REDIS_URL`` wins)."""

    redis_url: str | None = Field(None, description="redis://, rediss:// or unix:// (none: in memory)")
    key_prefix: str = Field("fairgate", min_length=1, description="prefix of every Redis key")
    snapshot_interval_s: float = Field(1.0, gt=0, description="how often the dispatcher writes its state")
    connect_timeout_s: float = Field(60.0, gt=0, description="how long to wait for Redis at start")

    @field_validator("redis_url")
    @classmethod
    def _redis(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return url or None


class TelemetrySettings(Section):
    """Traces over OTLP when ``otlp_endpoint`` is set (or ``OTEL_EXPORTER_OTLP_ENDPOINT``); ``traces:
    memory`` keeps spans in each process (tests). Metrics: Prometheus at ``/metrics``, per-tenant series
    for the ``top_tenants`` most served tenants, the rest summed as ``other``."""

    otlp_endpoint: str | None = Field(None, description="OTLP endpoint for traces and metrics")
    traces: Literal["off", "memory"] = Field("off", description="memory: spans kept in each process (tests)")
    top_tenants: int = Field(20, ge=1, description="tenants with series of their own on /metrics")
    trace_sample_ratio: float = Field(1.0, ge=0, le=1, description="share of requests traced (busy: 0.01-0.1)")

    @field_validator("traces", mode="before")
    @classmethod
    def _bare_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML reads a bare off as false


class QuotaConfig(Section):
    """A quota (docs/gateway.md): what one tenant, or every tenant under one tree node together, may use
    per window, in tokens (prompt and output), in money (at each model's ``prices``) or both; a request
    that could take it over is refused with 429 ``insufficient_quota`` and the time its window turns."""

    node: str = Field(min_length=1, description="the tenant or tree node it applies to")
    window: Literal["minute", "hour", "day"] = Field(description="the window it counts over (fixed, UTC)")
    max_tokens: int | None = Field(None, ge=1, description="prompt and output tokens per window")
    max_cost: float | None = Field(None, gt=0, description="money per window, at the models' prices")
    over: Literal["reject", "demote"] = Field(
        "reject",
        description="a request that could take it over: refused (429 insufficient_quota) or demote (served"
        " only from capacity no request within its quotas is waiting for)",
    )
    min_tokens: int | None = Field(
        None, ge=0, description="tokens per window guaranteed inside the quota above it (kept from everyone else)"
    )
    min_cost: float | None = Field(None, ge=0, description="money per window guaranteed likewise")

    def rule(self) -> QuotaRule:
        """The core's quota rule."""
        return QuotaRule(
            self.node, self.window, self.max_tokens, self.max_cost, self.over, self.min_tokens, self.min_cost
        )

    @model_validator(mode="after")
    def _some_limit(self) -> QuotaConfig:
        if self.max_tokens is None and self.max_cost is None and self.min_tokens is None and self.min_cost is None:
            raise ValueError("give max_tokens, max_cost, a minimum or several")
        for low, high, what in ((self.min_tokens, self.max_tokens, "tokens"), (self.min_cost, self.max_cost, "cost")):
            if low is not None and high is not None and low > high:
                raise ValueError(f"min_{what} must not be above max_{what}")
        return self


class PriceConfig(Section):
    """One model's prices, in money per million tokens (for money quotas)."""

    input: float = Field(0.0, ge=0, description="per million prompt tokens the engine computed")
    cached_input: float = Field(0.0, ge=0, description="per million prompt tokens found in its prefix cache")
    output: float = Field(0.0, ge=0, description="per million output tokens")

    def prices(self) -> Prices:
        """The core's prices."""
        return Prices(self.input, self.cached_input, self.output)


class GatewayConfig(Section):
    """The whole configuration, checked (``fairgate.gateway.config_schema.validate``): what every process
    of the gateway is built from."""

    model: str  # the first model's name (a one-model gateway: the model)
    scheduler: InstanceOf[SchedulerConfig]  # the core's own settings, typed (they travel through Ray as they are)
    workers: WorkerSettings  # the first model's workers
    models: tuple[ModelPool, ...]  # every model, the first one included
    ingress: IngressSettings
    tenants: tuple[TenantConfig, ...]
    tree: tuple[NodeConfig, ...] = ()
    classes: tuple[ClassConfig, ...] = ()
    admin_key_hash: str = ""
    key_hash_fingerprint: str = ""  # "": hashes still plain digests (keyed() keys them)
    state: StateSettings = Field(default_factory=StateSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    shards: ShardSettings = Field(default_factory=ShardSettings)
    quotas: tuple[QuotaConfig, ...] = ()
    prices: dict[str, PriceConfig] = Field(default_factory=dict)  # model -> its prices
    adapters: tuple[AdapterConfig, ...] = ()
    adapter_models: dict[str, bool] = Field(default_factory=dict)  # model -> whether its workers take adapters

    def prices_of(self, model: str) -> Prices:
        """A model's prices (none configured: free)."""
        price = self.prices.get(model)
        return Prices() if price is None else price.prices()

    def keyed(self, hasher: KeyHasher) -> GatewayConfig:
        """This configuration with its key digests keyed (what leaves the process that read it)."""
        tenants = tuple(t.model_copy(update={"key_hash": hasher.upgrade(t.key_hash)}) for t in self.tenants)
        return self.model_copy(
            update={
                "tenants": tenants,
                "admin_key_hash": hasher.upgrade(self.admin_key_hash),
                "key_hash_fingerprint": hasher.fingerprint(),
            }
        )

    def with_first(self, *, model: str | None = None, workers: WorkerSettings | None = None) -> GatewayConfig:
        """This configuration with its first model renamed or its workers changed (command-line overrides)."""
        first = self.models[0]
        update: dict[str, Any] = {}
        if model is not None:
            update["name"] = model
        if workers is not None:
            update["workers"] = workers
        return self.with_models([first.model_copy(update=update), *self.models[1:]])

    def with_models(self, models: list[ModelPool]) -> GatewayConfig:
        """This configuration serving ``models`` (the first one is also ``model`` / ``workers``)."""
        return self.model_copy(update={"models": tuple(models), "model": models[0].name, "workers": models[0].workers})
