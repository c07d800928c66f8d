"""The gateway's configuration schema: one YAML file, validated here into typed, frozen sections.

Tenant identity and weight come only from here (and the admin API): the ingress maps an API key's hash
to a tenant; no header or body field a client sends can change who it is or how much it weighs.

Every process reads its own section of the same validated configuration (it travels through Ray as
plain data, ``GatewayConfig.plain``). The workers' engine-specific settings are kept as given
(``workers.settings``): each engine plug-in validates its own (``gateway.config`` does it at load
time), so nothing here knows any engine. Errors name the field and the value: ``ConfigError``.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dispatcher.core import SchedulerConfig, cost_from_spec, make_placement, make_policy
from dispatcher.core.classes import RequestClass
from dispatcher.core.tree import TreeError, check_tree

ADMIN = "(admin)"  # where validate reports a generated admin key


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the field."""


class _Section(BaseModel):
    """A section whose unknown keys are refused; numbers are numbers (no bools, no strings)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class _OpenSection(_Section):
    """A section that ignores keys it does not know (as it always has)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class TenantConfig(_Section):
    name: str
    key_hash: str
    weight: float = 1.0
    cache_group: str = ""  # tenants of one group share cached prefixes ("": the tenant's own, apart)
    parent: str = ""  # its node in the tenant tree ("": the root)
    classes: tuple[str, ...] = ()  # request classes it may use (none listed: every class not strict)


class NodeConfig(_Section):
    """A node of the tenant tree (an organisation, a team): tenants and nodes under it share its weight."""

    name: str = Field(min_length=1, max_length=64)
    parent: str = ""
    weight: float = Field(1.0, gt=0, le=1e6)


class ClassConfig(_Section):
    """A request class (DESIGN §2b), chosen by the client with OpenAI's ``service_tier`` (``tier``, by
    default the class's name, e.g. ``flex`` for batch); ``strict``: served before every other class
    (operators); ``ttft_s``: its first-token objective (within the class, earliest deadline first)."""

    name: str = Field(min_length=1, max_length=32)
    weight: float = Field(1.0, gt=0, le=1e6)
    tier: str = ""
    strict: bool = False
    ttft_s: float | None = Field(None, gt=0)


class LimitsSettings(_Section):
    """Caps on requests waiting in the dispatcher (None: no cap)."""

    max_queued_per_tenant: int | None = Field(None, ge=1)
    max_queued: int | None = Field(None, ge=1)
    max_queue_s: float | None = Field(None, gt=0)


class AutoscalingSettings(_Section):
    """Replicas follow the dispatcher's demand between ``min_replicas`` (0: scale to zero) and
    ``max_replicas``; a change must be wanted for ``upscale_delay_s`` / ``downscale_delay_s`` first."""

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(4, ge=1)
    upscale_delay_s: float = Field(3.0, ge=0)
    downscale_delay_s: float = Field(30.0, ge=0)
    target_utilization: float = Field(0.8, gt=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> AutoscalingSettings:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})")
        return self


class WorkerSettings(_Section):
    """The worker replicas. ``settings``: the engine's own settings (e.g. ``kv_tokens`` and
    ``step_model`` of the simulated engine, the ``vllm`` section), validated by the engine plug-in."""

    count: int = Field(2, ge=0)
    engine: str = "simulated"
    num_gpus: float = Field(0.0, ge=0)  # GPUs per worker replica (1 for vLLM on a GPU machine)
    num_cpus: float = Field(0.0, ge=0)  # CPUs per worker replica (k8s cpu-sim: 1, so replicas land on worker pods)
    autoscaling: AutoscalingSettings | None = None  # None: a fixed ``count``
    graceful_shutdown_s: float = Field(600.0, gt=0)  # a replica scaled down finishes what it runs within this
    settings: dict[str, Any] = Field(default_factory=dict)


class ModelPool(_Section):
    """One model behind the endpoint: a pool of worker replicas (its engine, settings and autoscaling),
    fair within itself. ``tenants``: who may use it (None: every tenant)."""

    name: str = Field(min_length=1)
    workers: WorkerSettings
    tenants: tuple[str, ...] | None = None


class IngressSettings(_OpenSection):
    replicas: int = Field(1, ge=1)
    max_body_bytes: int = Field(1 << 20, ge=1)
    default_max_tokens: int = Field(256, ge=1)
    max_model_len: int = Field(4096, ge=2)


class StateSettings(_Section):
    """Where durable state lives: in memory (None, the default) or Redis (``FAIRGATE_REDIS_URL`` wins)."""

    redis_url: str | None = None
    key_prefix: str = Field("fairgate", min_length=1)
    snapshot_interval_s: float = Field(1.0, gt=0)
    connect_timeout_s: float = Field(60.0, gt=0)

    @field_validator("redis_url")
    @classmethod
    def _redis(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return url or None


class TelemetrySettings(_Section):
    """Traces over OTLP when ``otlp_endpoint`` is set (or ``OTEL_EXPORTER_OTLP_ENDPOINT``); ``traces:
    memory`` keeps spans in each process (tests). Metrics: Prometheus at ``/metrics``, per-tenant series
    for the ``top_tenants`` most served tenants, the rest summed as ``other``."""

    otlp_endpoint: str | None = None
    traces: Literal["off", "memory"] = "off"
    top_tenants: int = Field(20, ge=1)
    trace_sample_ratio: float = Field(1.0, ge=0, le=1)  # share of requests traced (busy gateways: 0.01-0.1)

    @field_validator("traces", mode="before")
    @classmethod
    def _bare_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML reads a bare off as false


class GatewayConfig(_Section):
    model: str  # the first model's name (a one-model gateway: the model)
    scheduler: dict[str, Any]  # SchedulerConfig.to_dict(): plain data, so it travels through Ray
    workers: WorkerSettings  # the first model's workers
    models: tuple[ModelPool, ...]  # every model, the first one included
    ingress: IngressSettings
    tenants: tuple[TenantConfig, ...]
    tree: tuple[NodeConfig, ...] = ()
    classes: tuple[ClassConfig, ...] = ()
    admin_key_hash: str = ""
    state: StateSettings = Field(default_factory=StateSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)

    def plain(self) -> dict[str, Any]:
        """The configuration as plain data (what travels to Serve replicas): key hashes, never keys."""
        data = self.model_dump()
        data["tenants"] = [{**t, "classes": list(t["classes"])} for t in data["tenants"]]
        data["tree"] = list(data["tree"])
        data["classes"] = [{**c, "tier": c["tier"] or c["name"]} for c in data["classes"]]
        data["models"] = [
            {**m, "tenants": None if m["tenants"] is None else list(m["tenants"])} for m in data["models"]
        ]
        return data

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
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    generated: dict[str, str] = {}
    tenants = _tenants(raw, where, generated)
    _check_tree(tree, tenants, classes, where)
    if (tree or any(t.parent for t in tenants)) and not make_policy(scheduler["policy"]).tree:
        raise ConfigError(
            f"{where}: tree: a tenant tree needs a policy that orders by counters, not {scheduler['policy']!r}"
        )
    admin_key = secret_from_env("FAIRGATE_ADMIN_KEY") or raw.get("admin_api_key")
    if admin_key is None:
        admin_key = generated[ADMIN] = "fg-admin-" + secrets.token_urlsafe(24)
    elif not isinstance(admin_key, str) or len(admin_key) < 16:
        raise ConfigError(f"{where}: admin_api_key (or FAIRGATE_ADMIN_KEY) must be at least 16 characters")
    if hash_key(admin_key) in {t.key_hash for t in tenants}:
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
        admin_key_hash=hash_key(admin_key),
        state=state,
        telemetry=telemetry,
    )
    return config, generated


def read_yaml(path: str | Path, what: str = "config") -> Any:
    """A YAML file's content; unreadable or malformed files raise ConfigError naming the file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path}: cannot parse YAML: {str(exc).splitlines()[0]}") from None


def secret_from_env(name: str) -> str | None:
    """A secret from the environment: ``NAME`` itself, or the file named by ``NAME_FILE`` (as mounted
    from a Kubernetes Secret). None when neither is set."""
    value = os.environ.get(name)
    if value:
        return value
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip() or None
        except OSError as exc:
            raise ConfigError(f"cannot read {name}_FILE {path}: {exc.strerror or exc}") from None
    return None


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


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


def _classes(raw: Any) -> list[ClassConfig]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("classes must be a list of {name, weight, tier, strict, ttft_s}")
    classes = [validate_section(ClassConfig, c, f"classes[{i}]") for i, c in enumerate(raw)]
    tiers = [c.tier or c.name for c in classes]
    if len(set(tiers)) != len(tiers):
        raise ValueError("classes: every class needs its own tier")
    return classes


def _tree(raw: Any) -> list[NodeConfig]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("tree must be a list of {name, parent, weight}")
    return [validate_section(NodeConfig, n, f"tree[{i}]") for i, n in enumerate(raw)]


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
    policy = make_policy(str(raw.get("policy", "vtc"))).spec
    placement = make_placement(str(raw.get("placement", "most-room"))).name
    cost = cost_from_spec(raw.get("cost"))
    limits = validate_section(LimitsSettings, raw.get("limits") or {}, "limits")
    strict = raw.get("strict_head_of_line", True)
    if not isinstance(strict, bool):
        raise ValueError(f"strict_head_of_line must be true or false, got {strict!r}")
    for gone in REMOVED_SETTINGS:
        if gone in raw:
            raise ValueError(
                f"{gone} is no longer a setting: requests are admitted by each engine's own rule "
                "(room for the prompt now), and nothing is reserved for output"
            )
    queue = raw.get("max_engine_waiting", 8)
    if isinstance(queue, bool) or not isinstance(queue, int) or queue < 0:
        raise ValueError(f"max_engine_waiting must be a whole number >= 0, got {queue!r}")
    overcommit = raw.get("overcommit", 2.0)
    if isinstance(overcommit, bool) or not isinstance(overcommit, int | float) or not overcommit >= 1:
        raise ValueError(f"overcommit must be a number >= 1, got {overcommit!r}")
    return SchedulerConfig(
        max_engine_waiting=queue,
        overcommit=float(overcommit),
        policy=policy,
        cost=cost,
        placement=placement,
        strict_head_of_line=strict,
        max_queued_per_tenant=limits.max_queued_per_tenant,
        max_queued=limits.max_queued,
        max_queue_s=limits.max_queue_s,
        classes=tuple(RequestClass(c.name, c.weight, c.strict, c.ttft_s) for c in classes),
    ).to_dict()


def _tenants(raw: dict[str, Any], where: str, generated: dict[str, str]) -> list[TenantConfig]:
    tenants = []
    for i, t in enumerate(_tenant_rows(raw, where)):
        if not isinstance(t, dict) or not t.get("name"):
            raise ConfigError(f"{where}: tenants[{i}] needs a name")
        key = t.get("api_key")
        if key is None:
            key = generated[str(t["name"])] = "fg-" + secrets.token_urlsafe(24)
        elif not isinstance(key, str) or len(key) < 16:
            raise ConfigError(f"{where}: tenants[{i}].api_key must be a string of at least 16 characters")
        weight = t.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise ConfigError(f"{where}: tenants[{i}].weight must be a positive number, got {weight!r}")
        group = t.get("cache_group") or ""
        if not isinstance(group, str) or len(group) > 64:
            raise ConfigError(f"{where}: tenants[{i}].cache_group must be a name of at most 64 characters")
        parent = t.get("parent") or ""
        if not isinstance(parent, str):
            raise ConfigError(f"{where}: tenants[{i}].parent must be a tree node's name")
        classes = t.get("classes") or []
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise ConfigError(f"{where}: tenants[{i}].classes must be a list of request class names")
        tenants.append(
            TenantConfig(
                name=str(t["name"]),
                key_hash=hash_key(key),
                weight=float(weight),
                cache_group=group,
                parent=parent,
                classes=tuple(classes),
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


M = TypeVar("M", bound=BaseModel)


def validate_section(model: type[M], raw: Any, name: str) -> M:
    """Validate one section (``name``: where it sits, e.g. ``workers.vllm``); the first problem
    becomes a ``ValueError`` of one clear line naming the field and the value."""
    if not isinstance(raw, dict):
        raise ValueError(f"{name} must be a mapping, got {raw!r}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(_explain(exc.errors()[0], name, model)) from None


def _explain(error: Any, section: str, model: type[BaseModel]) -> str:
    loc = [str(p) for p in error.get("loc", ()) if p != "settings"]
    field = ".".join([section, *loc])
    kind, ctx, value = error.get("type", ""), error.get("ctx") or {}, error.get("input")
    if kind == "extra_forbidden":
        owner = ".".join([section, *loc[:-1]])
        fields = _fields_at(model, loc[:-1])
        return f"{owner} takes {', '.join(sorted(fields))}; unknown: {loc[-1]}"
    wants = {
        "int_type": "a whole number",
        "float_type": "a number",
        "bool_type": "true or false",
        "string_type": "a string",
        "model_type": "a mapping",
        "dict_type": "a mapping",
        "greater_than_equal": f">= {ctx.get('ge')}",
        "greater_than": f"> {ctx.get('gt')}",
        "less_than_equal": f"<= {ctx.get('le')}",
        "less_than": f"< {ctx.get('lt')}",
        "literal_error": f"one of {ctx.get('expected')}",
        "string_too_short": "a non-empty string",
    }.get(kind)
    if wants is not None:
        return f"{field} must be {wants}, got {value!r}"
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{field}: {message}"


def _fields_at(model: type[BaseModel], path: list[str]) -> list[str]:
    for name in path:
        annotation = model.model_fields[name].annotation
        inner = [a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type)]
        model = next(a for a in inner if issubclass(a, BaseModel))
    return list(model.model_fields)
