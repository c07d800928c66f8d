"""The gateway's configuration schema: one YAML file, validated here into typed, frozen sections.

Tenant identity and weight come only from here (and the admin API): the ingress maps an API key's hash
to a tenant; no header or body field a client sends can change who it is or how much it weighs.

Every process reads its own section of the same validated configuration (it travels through Ray as
plain data, ``GatewayConfig.plain``). The workers' engine-specific settings are kept as given
(``workers.settings``): each engine plug-in validates its own (``fairgate.gateway.config`` does it at load
time), so nothing here knows any engine. Errors name the field and the value: ``ConfigError``.
The reference page of every key (``docs/configuration.md``) is generated from these models.
"""

from __future__ import annotations

import os
import secrets
from typing import Any, Literal

from fairgate.common.frame_guard import DEFAULT_MAX_BODY_BYTES
from fairgate.common.key_hashing import KeyHasher, key_digest
from fairgate.common.sections import (
    ConfigError,
    M,
    OpenSection,
    Section,
    read_yaml,
    secret_from_env,
    validate_section,
)
from fairgate.common.tenant_schema import (
    MIN_KEY_CHARS,
    AdapterConfig,
    ClassConfig,
    NodeConfig,
    TenantConfig,
    TenantEntry,
)
from pydantic import Field, field_validator, model_validator

from fairgate.core import SchedulerConfig, cost_from_spec, make_placement, make_policy
from fairgate.core.classes import RequestClass
from fairgate.core.tree import TreeError, check_tree

ADMIN = "(admin)"  # where validate reports a generated admin key


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
    ``policy``: the fairness policy's spec (``vtc``, ``vtc-locality:2000``, ``fcfs``, ``rpm:60``, ...);
    ``placement``: ``most-room`` or ``prefix-affinity``; ``strict_head_of_line``: when the next request
    fits no worker, wait for it (true) or let up to 16 others' requests go first; ``max_engine_waiting``:
    requests that may wait inside one engine beyond its room (0: none); ``overcommit``: the pools'
    worth of expected use the requests in flight on one worker may reach; ``objective_reserve``: the
    share of each engine's KV only urgent requests (of classes that enforce their objective) start into;
    ``revoke``: take back requests engines hold unstarted from tenants more served than one that waits
    with nowhere to go (revocation by over-service)."""

    policy: str = Field(
        _SCHEDULER_DEFAULTS.policy, description="fairness policy: vtc, vtc-locality[:Δ], vtc-predict, fcfs, lcf, rpm:N"
    )
    placement: str = Field(_SCHEDULER_DEFAULTS.placement, description="which worker: most-room or prefix-affinity")
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
    worker replica of a pool."""

    admission_port: int = Field(0, ge=0, le=65535, description="the dispatcher's admission endpoint (from ingress)")
    dispatcher_port: int = Field(0, ge=0, le=65535, description="the dispatcher's endpoint for workers' reports")
    worker_port: int = Field(0, ge=0, le=65535, description="each worker's data plane (from ingress)")


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


class GatewayConfig(Section):
    model: str  # the first model's name (a one-model gateway: the model)
    scheduler: dict[str, Any]  # SchedulerConfig.to_dict(): plain data, so it travels through Ray
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
    quotas: tuple[QuotaConfig, ...] = ()
    prices: dict[str, PriceConfig] = Field(default_factory=dict)  # model -> its prices
    adapters: tuple[AdapterConfig, ...] = ()

    def plain(self) -> dict[str, Any]:
        """The configuration as plain data (what travels to Serve replicas): key hashes, never keys."""
        data = self.model_dump()
        data["tenants"] = [{**t, "classes": list(t["classes"])} for t in data["tenants"]]
        data["tree"] = list(data["tree"])
        data["quotas"] = list(data["quotas"])
        data["classes"] = [{**c, "tier": c["tier"] or c["name"]} for c in data["classes"]]
        data["models"] = [
            {**m, "tenants": None if m["tenants"] is None else list(m["tenants"])} for m in data["models"]
        ]
        data["adapters"] = [{**a, "nodes": list(a["nodes"])} for a in data["adapters"]]
        data["adapter_models"] = adapter_models(self.models)
        return data

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


# ---------------------------------------------------------------------------------------------- reading


def validate(raw: Any, where: str = "config") -> tuple[GatewayConfig, dict[str, str]]:
    """Check a configuration (parsed YAML). Returns it and the API keys generated for tenants that had
    none (tenant -> key; ``ADMIN`` for a generated admin key), to show once and never store."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping")
    try:
        classes = _classes(raw.get("classes"))
        scheduler = _scheduler(raw, classes)
        tree = _tree(raw.get("tree"))
        models = _models(raw)
        ingress = validate_section(IngressSettings, raw.get("ingress") or {}, "ingress")
        state = validate_section(StateSettings, _state_env(raw.get("state") or {}), "state")
        telemetry = validate_section(TelemetrySettings, _telemetry_env(raw.get("telemetry") or {}), "telemetry")
        network = validate_section(NetworkSettings, raw.get("network") or {}, "network")
        quotas = _entries(QuotaConfig, raw.get("quotas"), "quotas")
        prices = _prices(raw.get("prices"), models)
        adapters = _entries(AdapterConfig, raw.get("adapters"), "adapters")
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    generated: dict[str, str] = {}
    tenants = _tenants(raw, where, generated)
    _check_tree(tree, tenants, classes, where)
    _check_quotas(quotas, tenants, tree, where)
    if (tree or any(t.parent for t in tenants)) and not make_policy(scheduler["policy"]).tree:
        raise ConfigError(
            f"{where}: tree: a tenant tree needs a policy that orders by counters, not {scheduler['policy']!r}"
        )
    admin_key = secret_from_env("FAIRGATE_ADMIN_KEY") or raw.get("admin_api_key")
    if admin_key is None:
        admin_key = generated[ADMIN] = "fg-admin-" + secrets.token_urlsafe(24)
    elif not isinstance(admin_key, str) or len(admin_key) < MIN_KEY_CHARS:
        raise ConfigError(f"{where}: admin_api_key (or FAIRGATE_ADMIN_KEY) must be at least {MIN_KEY_CHARS} characters")
    if key_digest(admin_key) in {t.key_hash for t in tenants}:
        raise ConfigError(f"{where}: the admin key must differ from every tenant's key")
    names = {t.name for t in tenants}
    for m in models:
        unknown = sorted(set(m.tenants or ()) - names)
        if unknown:
            raise ConfigError(f"{where}: models[{m.name}].tenants names unknown tenants: {', '.join(unknown)}")
    config = GatewayConfig(
        model=models[0].name,
        scheduler=scheduler,
        workers=models[0].workers,
        models=tuple(models),
        ingress=ingress,
        tenants=tuple(tenants),
        tree=tuple(tree),
        classes=tuple(classes),
        admin_key_hash=key_digest(admin_key),
        state=state,
        telemetry=telemetry,
        network=network,
        quotas=tuple(quotas),
        prices=prices,
        adapters=tuple(adapters),
    )
    return config, generated


# ---------------------------------------------------------------------------------------------- sections

GENERIC_WORKER_KEYS = frozenset(WorkerSettings.model_fields) - {"settings"}


def _split_workers(raw: Any) -> Any:
    """The ``workers`` section's own keys, and everything else as the engine's settings."""
    if not isinstance(raw, dict):
        return raw
    own = {k: v for k, v in raw.items() if k in GENERIC_WORKER_KEYS}
    return {**own, "settings": {k: v for k, v in raw.items() if k not in GENERIC_WORKER_KEYS}}


def _models(raw: dict[str, Any]) -> list[ModelPool]:
    """``models:`` (a list of pools), or the one-model form: ``model`` and ``workers``."""
    listed = raw.get("models")
    if listed is None:
        workers = validate_section(WorkerSettings, _split_workers(raw.get("workers") or {}), "workers")
        return [ModelPool(name=str(raw.get("model", "fairgate-sim")), workers=workers)]
    if "model" in raw or "workers" in raw:
        raise ValueError("give models, or model and workers, not both")
    if not isinstance(listed, list) or not listed:
        raise ValueError("models must be a non-empty list of {name, workers, tenants}")
    pools = []
    for i, m in enumerate(listed):
        if not isinstance(m, dict):
            raise ValueError(f"models[{i}] must be a mapping")
        where = f"models[{i}]"
        unknown = sorted(set(m) - {"name", "workers", "tenants"})
        if unknown:
            raise ValueError(f"{where} takes name, workers, tenants; unknown: {unknown[0]}")
        workers = validate_section(WorkerSettings, _split_workers(m.get("workers") or {}), f"{where}.workers")
        tenants = m.get("tenants")
        if tenants is not None and (not isinstance(tenants, list) or not all(isinstance(t, str) for t in tenants)):
            raise ValueError(f"{where}.tenants must be a list of tenant names")
        pools.append(
            validate_section(
                ModelPool,
                {"name": m.get("name"), "workers": workers, "tenants": None if tenants is None else tuple(tenants)},
                where,
            )
        )
    if len({p.name for p in pools}) != len(pools):
        raise ValueError("models: every model needs its own name")
    return pools


def _state_env(raw: Any) -> Any:
    url = secret_from_env("FAIRGATE_REDIS_URL")
    return {**raw, "redis_url": url} if url and isinstance(raw, dict) else raw


def _telemetry_env(raw: Any) -> Any:
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if endpoint and isinstance(raw, dict) and not raw.get("otlp_endpoint"):
        return {**raw, "otlp_endpoint": endpoint}
    return raw


def _entries(model: type[M], raw: Any, name: str) -> list[M]:
    """A list section (``tree``, ``classes``): each entry validated as ``model`` (absent: none)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError(f"{name} must be a list of {{{', '.join(model.model_fields)}}}")
    return [validate_section(model, entry, f"{name}[{i}]") for i, entry in enumerate(raw)]


def _prices(raw: Any, models: list[ModelPool]) -> dict[str, PriceConfig]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError("prices must map model names to {input, cached_input, output}")
    names = {m.name for m in models}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ValueError(f"prices: no model named {unknown[0]!r}")
    return {name: validate_section(PriceConfig, entry, f"prices.{name}") for name, entry in raw.items()}


def _check_quotas(quotas: list[QuotaConfig], tenants: list[TenantConfig], tree: list[NodeConfig], where: str) -> None:
    names = {t.name for t in tenants} | {n.name for n in tree}
    seen: set[tuple[str, str]] = set()
    for q in quotas:
        if q.node not in names:
            raise ConfigError(f"{where}: quotas: no tenant or tree node named {q.node!r}")
        if (q.node, q.window) in seen:
            raise ConfigError(f"{where}: quotas: {q.node!r} has two quotas per {q.window}")
        seen.add((q.node, q.window))
    _check_minimums(quotas, {t.name: t.parent for t in tenants} | {n.name: n.parent for n in tree}, where)


def _check_minimums(quotas: list[QuotaConfig], parents: dict[str, str], where: str) -> None:
    """Each minimum sits inside a quota above it of the same window that limits the same thing (its
    parent quota), and the minimums a parent quota keeps fit its maximum."""
    by_key = {(q.node, q.window): q for q in quotas}
    kept: dict[tuple[str, str, str], float] = {}
    for q in quotas:
        for low, limit in ((q.min_tokens, "max_tokens"), (q.min_cost, "max_cost")):
            if low is None:
                continue
            above = parents.get(q.node, "")
            while above and getattr(by_key.get((above, q.window)), limit, None) is None:
                above = parents.get(above, "")
            if not above:
                raise ConfigError(
                    f"{where}: quotas: {q.node!r}'s minimum per {q.window} needs a quota with {limit} on a node "
                    "above it, in the same window"
                )
            kept[(above, q.window, limit)] = kept.get((above, q.window, limit), 0.0) + low
    for (node, window, limit), total in kept.items():
        if total > getattr(by_key[(node, window)], limit):
            raise ConfigError(
                f"{where}: quotas: the minimums under {node!r} per {window} ({total:g}) exceed its {limit}"
            )


def _classes(raw: Any) -> list[ClassConfig]:
    classes = _entries(ClassConfig, raw, "classes")
    tiers = [c.tier or c.name for c in classes]
    if len(set(tiers)) != len(tiers):
        raise ValueError("classes: every class needs its own tier")
    return classes


def _tree(raw: Any) -> list[NodeConfig]:
    return _entries(NodeConfig, raw, "tree")


def adapter_models(models: tuple[ModelPool, ...] | list[ModelPool]) -> dict[str, bool]:
    """Each model's name, and whether its workers have adapter slots (``max_loras`` set)."""
    from fairgate.workers.engines import engine_for

    return {m.name: engine_for(m.workers.engine).serves_adapters(m.workers.settings) for m in models}


def check_adapters(config: GatewayConfig, where: str) -> None:
    """The adapters, checked by the registry the dispatcher keeps them in, once the engines' settings
    are checked (whether a pool has adapter slots is its engine's to say): one line naming what is wrong."""
    from fairgate.dispatcher.adapter_registry import AdapterRecord, AdapterRegistry
    from fairgate.dispatcher.tenant_registry import TenantError

    known = {n.name for n in config.tree} | {t.name for t in config.tenants}
    registry = AdapterRegistry([], adapter_models(config.models))
    for a in config.adapters:
        try:
            registry.create(AdapterRecord(a.name, a.base_model, a.path, list(a.nodes)), known.__contains__)
        except TenantError as exc:
            raise ConfigError(f"{where}: adapters[{a.name}]: {exc}") from None


def _check_tree(tree: list[NodeConfig], tenants: list[TenantConfig], classes: list[ClassConfig], where: str) -> None:
    """The tree the configuration makes, built once by the core: one line naming what is wrong."""
    if len({n.name for n in tree}) != len(tree):
        raise ConfigError(f"{where}: tree: every node needs its own name")
    known = {c.name for c in classes}
    for t in tenants:
        unknown = sorted(set(t.classes) - known)
        if unknown:
            raise ConfigError(f"{where}: tenants[{t.name}].classes: no request class {unknown[0]!r}")
    try:
        check_tree({n.name: (n.parent, n.weight) for n in tree}, ((t.name, t.parent, t.weight) for t in tenants))
    except TreeError as exc:
        raise ConfigError(f"{where}: tree: {exc}") from None


REMOVED_SETTINGS = ("reserve", "output_reserve_cap")  # admission by reservation (before admission by usage)


def _scheduler(raw: dict[str, Any], classes: list[ClassConfig]) -> dict[str, Any]:
    for gone in REMOVED_SETTINGS:
        if gone in raw:
            raise ValueError(
                f"{gone} is no longer a setting: requests are admitted by each engine's own rule "
                "(room for the prompt now), and nothing is reserved for output"
            )
    own = {k: raw[k] for k in SchedulerSettings.model_fields if k in raw and raw[k] is not None}
    settings = validate_section(SchedulerSettings, own, "")  # its keys are top-level ones
    limits = settings.limits
    return SchedulerConfig(
        max_engine_waiting=settings.max_engine_waiting,
        overcommit=settings.overcommit,
        objective_reserve=settings.objective_reserve,
        revoke=settings.revoke,
        policy=make_policy(settings.policy).spec,
        cost=cost_from_spec(settings.cost.model_dump(exclude_none=True)),
        placement=make_placement(settings.placement).name,
        strict_head_of_line=settings.strict_head_of_line,
        max_queued_per_tenant=limits.max_queued_per_tenant,
        max_queued=limits.max_queued,
        max_queue_s=limits.max_queue_s,
        classes=tuple(RequestClass(c.name, c.weight, c.strict, c.ttft_s, c.on_miss, c.downgrade_to) for c in classes),
    ).to_dict()


def _tenants(raw: dict[str, Any], where: str, generated: dict[str, str]) -> list[TenantConfig]:
    tenants = []
    for i, row in enumerate(_tenant_rows(raw, where)):
        if not isinstance(row, dict) or not row.get("name"):
            raise ConfigError(f"{where}: tenants[{i}] needs a name")
        given = {k: v for k, v in row.items() if v is not None} | {"name": str(row["name"])}
        try:
            t = validate_section(TenantEntry, given, f"tenants[{i}]")
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        key = t.api_key
        if key is None:
            key = generated[t.name] = "fg-" + secrets.token_urlsafe(24)
        tenants.append(
            TenantConfig(
                name=t.name,
                key_hash=key_digest(key),
                weight=t.weight,
                cache_group=t.cache_group,
                parent=t.parent,
                classes=tuple(t.classes),
            )
        )
    if not tenants:
        raise ConfigError(f"{where}: at least one tenant is needed")
    if len({t.name for t in tenants}) != len(tenants) or len({t.key_hash for t in tenants}) != len(tenants):
        raise ConfigError(f"{where}: tenant names and API keys must be unique")
    return tenants


def _tenant_rows(raw: dict[str, Any], where: str) -> list[Any]:
    """``tenants`` inline, or ``tenants_file``: a YAML list kept apart from the rest (a mounted Secret)."""
    path = raw.get("tenants_file")
    if path is None:
        return list(raw.get("tenants") or [])
    if raw.get("tenants"):
        raise ConfigError(f"{where}: give tenants or tenants_file, not both")
    rows = read_yaml(path, what=f"{where}: tenants_file")
    if not isinstance(rows, list):
        raise ConfigError(f"{where}: tenants_file {path} must hold a list of tenants")
    return rows
