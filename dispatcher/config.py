"""The gateway's configuration: one YAML file (the embedded default is ``fairgate/default_config.yaml``).

Tenant identity and weight come only from here: the ingress maps an API key's hash to a tenant; no
header or body field a client sends can change who it is or how much it weighs.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from dispatcher.core import SchedulerConfig, cost_from_spec, parse_policy
from workers.engine import StepTimeModel
from workers.vllm_engine.settings import VllmSettings

ADMIN = "(admin)"  # where load_config reports a generated admin key


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the field."""


@dataclass(frozen=True)
class TenantConfig:
    name: str
    key_hash: str
    weight: float = 1.0


@dataclass(frozen=True)
class AutoscalingSettings:
    """Replicas follow the dispatcher's demand between ``min_replicas`` (0: scale to zero) and
    ``max_replicas``; a change must be wanted for ``upscale_delay_s`` / ``downscale_delay_s`` first."""

    min_replicas: int = 1
    max_replicas: int = 4
    upscale_delay_s: float = 3.0
    downscale_delay_s: float = 30.0
    target_utilization: float = 0.8


@dataclass(frozen=True)
class WorkerSettings:
    count: int = 2
    engine: str = "simulated"
    kv_tokens: int = 10_000
    block_size: int = 16
    max_running: int | None = None
    step_model: dict[str, float] = field(default_factory=lambda: StepTimeModel.a10g_llama7b().to_dict())
    vllm: dict[str, Any] = field(default_factory=dict)  # VllmSettings.to_dict(), when engine is vllm
    num_gpus: float = 0.0  # GPUs per worker replica (1 for vLLM on a GPU machine)
    num_cpus: float = 0.0  # CPUs per worker replica (k8s cpu-sim: 1, so replicas land on worker pods)
    autoscaling: AutoscalingSettings | None = None  # None: a fixed ``count``
    graceful_shutdown_s: float = 600.0  # a replica scaled down finishes what it runs within this


@dataclass(frozen=True)
class IngressSettings:
    replicas: int = 1
    max_body_bytes: int = 1 << 20
    default_max_tokens: int = 256
    max_model_len: int = 4096


@dataclass(frozen=True)
class StateSettings:
    """Where durable state lives: in memory (None, the default) or Redis (``FAIRGATE_REDIS_URL`` wins)."""

    redis_url: str | None = None
    key_prefix: str = "fairgate"
    snapshot_interval_s: float = 1.0
    connect_timeout_s: float = 60.0


@dataclass(frozen=True)
class TelemetrySettings:
    """Traces over OTLP when ``otlp_endpoint`` is set (or ``OTEL_EXPORTER_OTLP_ENDPOINT``); ``traces:
    memory`` keeps spans in each process (tests). Metrics: Prometheus at ``/metrics``, per-tenant series
    for the ``top_tenants`` most served tenants, the rest summed as ``other``."""

    otlp_endpoint: str | None = None
    traces: str = "off"
    top_tenants: int = 20
    trace_sample_ratio: float = 1.0  # share of requests traced (busy gateways: 0.01-0.1)


@dataclass(frozen=True)
class GatewayConfig:
    model: str
    scheduler: dict[str, Any]  # SchedulerConfig.to_dict(), plain data so it travels through Ray
    workers: WorkerSettings
    ingress: IngressSettings
    tenants: tuple[TenantConfig, ...]
    admin_key_hash: str = ""
    state: StateSettings = field(default_factory=StateSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)


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


def load_config(path: str | Path | None = None) -> tuple[GatewayConfig, dict[str, str]]:
    """Read a config (the embedded default when ``path`` is None). Returns the config and the API keys
    generated for tenants that had none (tenant -> key), to show once and never store."""
    if path is None:
        text = resources.files("fairgate").joinpath("default_config.yaml").read_text()
        where = "default config"
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
        where = str(path)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: cannot parse YAML: {str(exc).splitlines()[0]}") from None
    return parse_config(raw, where)


def parse_config(raw: Any, where: str = "config") -> tuple[GatewayConfig, dict[str, str]]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping")
    try:
        policy = parse_policy(str(raw.get("policy", "vtc")))
        cost = cost_from_spec(raw.get("cost"))
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    reserve = raw.get("output_reserve_cap")
    limits = raw.get("limits") or {}
    if not isinstance(limits, dict) or set(limits) - {"max_queued_per_tenant", "max_queued", "max_queue_s"}:
        raise ConfigError(f"{where}: limits takes max_queued_per_tenant, max_queued and max_queue_s")
    per_tenant, total, wait_s = (limits.get(k) for k in ("max_queued_per_tenant", "max_queued", "max_queue_s"))
    if wait_s is not None and (isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or wait_s <= 0):
        raise ConfigError(f"{where}: limits.max_queue_s must be a positive number of seconds, got {wait_s!r}")
    scheduler = SchedulerConfig(
        policy=policy,
        cost=cost,
        strict_head_of_line=bool(raw.get("strict_head_of_line", True)),
        output_reserve_cap=None if reserve is None else _int(reserve, f"{where}: output_reserve_cap", 0),
        max_queued_per_tenant=None
        if per_tenant is None
        else _int(per_tenant, f"{where}: limits.max_queued_per_tenant", 1),
        max_queued=None if total is None else _int(total, f"{where}: limits.max_queued", 1),
        max_queue_s=None if wait_s is None else float(wait_s),
    ).to_dict()
    generated: dict[str, str] = {}
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
            raise ConfigError(f"{where}: tenants[{i}].weight must be a positive number")
        tenants.append(TenantConfig(str(t["name"]), hash_key(key), float(weight)))
    if not tenants:
        raise ConfigError(f"{where}: at least one tenant is needed")
    if len({t.name for t in tenants}) != len(tenants) or len({t.key_hash for t in tenants}) != len(tenants):
        raise ConfigError(f"{where}: tenant names and API keys must be unique")
    admin_key = secret_from_env("FAIRGATE_ADMIN_KEY") or raw.get("admin_api_key")
    if admin_key is None:
        admin_key = generated[ADMIN] = "fg-admin-" + secrets.token_urlsafe(24)
    elif not isinstance(admin_key, str) or len(admin_key) < 16:
        raise ConfigError(f"{where}: admin_api_key (or FAIRGATE_ADMIN_KEY) must be at least 16 characters")
    if hash_key(admin_key) in {t.key_hash for t in tenants}:
        raise ConfigError(f"{where}: the admin key must differ from every tenant's key")
    return GatewayConfig(
        model=str(raw.get("model", "fairgate-sim")),
        scheduler=scheduler,
        workers=parse_workers(raw.get("workers") or {}, where),
        ingress=_ingress(raw.get("ingress") or {}, where),
        tenants=tuple(tenants),
        admin_key_hash=hash_key(admin_key),
        state=_state(raw.get("state") or {}, where),
        telemetry=_telemetry(raw.get("telemetry") or {}, where),
    ), generated


def _tenant_rows(raw: dict[str, Any], where: str) -> list[Any]:
    """``tenants`` inline, or ``tenants_file``: a YAML list kept apart from the rest (a mounted Secret)."""
    path = raw.get("tenants_file")
    if path is None:
        return list(raw.get("tenants") or [])
    if raw.get("tenants"):
        raise ConfigError(f"{where}: give tenants or tenants_file, not both")
    try:
        rows = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read tenants_file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: tenants_file {path}: cannot parse YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(rows, list):
        raise ConfigError(f"{where}: tenants_file {path} must hold a list of tenants")
    return rows


def parse_workers(raw: dict[str, Any], where: str) -> WorkerSettings:
    """The ``workers`` section (also used for command-line overrides)."""
    step = raw.get("step_model", "a10g-llama7b")
    if step == "a10g-llama7b":
        step_model = StepTimeModel.a10g_llama7b().to_dict()
    elif isinstance(step, dict):
        try:
            step_model = StepTimeModel(**{k: float(v) for k, v in step.items()}).to_dict()
        except TypeError as exc:
            raise ConfigError(f"{where}: workers.step_model: {exc}") from None
    else:
        raise ConfigError(f"{where}: workers.step_model must be 'a10g-llama7b' or a mapping of coefficients")
    engine = str(raw.get("engine", "simulated"))
    if engine not in ("simulated", "vllm"):
        raise ConfigError(f"{where}: workers.engine must be 'simulated' or 'vllm', got {engine!r}")
    vllm: dict[str, Any] = {}
    if engine == "vllm":
        try:
            vllm = VllmSettings.from_dict(raw.get("vllm") or {}).to_dict()
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: workers.vllm: {exc}") from None
    num_gpus, num_cpus = raw.get("num_gpus", 0), raw.get("num_cpus", 0)
    for name, value in (("num_gpus", num_gpus), ("num_cpus", num_cpus)):
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ConfigError(f"{where}: workers.{name} must be a number >= 0, got {value!r}")
    max_running = raw.get("max_running")
    autoscaling = raw.get("autoscaling")
    return WorkerSettings(
        count=_int(raw.get("count", 2), f"{where}: workers.count", 0),
        engine=engine,
        kv_tokens=_int(raw.get("kv_tokens", 10_000), f"{where}: workers.kv_tokens", 1),
        block_size=_int(raw.get("block_size", 16), f"{where}: workers.block_size", 1),
        max_running=None if max_running is None else _int(max_running, f"{where}: workers.max_running", 1),
        step_model=step_model,
        vllm=vllm,
        num_gpus=float(num_gpus),
        num_cpus=float(num_cpus),
        autoscaling=None if autoscaling is None else _autoscaling(autoscaling, where),
        graceful_shutdown_s=_seconds(raw.get("graceful_shutdown_s", 600.0), f"{where}: workers.graceful_shutdown_s"),
    )


def _autoscaling(raw: Any, where: str) -> AutoscalingSettings:
    what = f"{where}: workers.autoscaling"
    fields = {f for f in AutoscalingSettings.__dataclass_fields__}
    if not isinstance(raw, dict) or set(raw) - fields:
        raise ConfigError(f"{what} takes {', '.join(sorted(fields))}")
    d = AutoscalingSettings()
    low = _int(raw.get("min_replicas", d.min_replicas), f"{what}.min_replicas", 0)
    high = _int(raw.get("max_replicas", d.max_replicas), f"{what}.max_replicas", max(1, low))
    utilization = raw.get("target_utilization", d.target_utilization)
    if isinstance(utilization, bool) or not isinstance(utilization, int | float) or not 0 < utilization <= 1:
        raise ConfigError(f"{what}.target_utilization must be in (0, 1], got {utilization!r}")
    return AutoscalingSettings(
        min_replicas=low,
        max_replicas=high,
        upscale_delay_s=_seconds(raw.get("upscale_delay_s", d.upscale_delay_s), f"{what}.upscale_delay_s", zero=True),
        downscale_delay_s=_seconds(
            raw.get("downscale_delay_s", d.downscale_delay_s), f"{what}.downscale_delay_s", zero=True
        ),
        target_utilization=float(utilization),
    )


def _seconds(value: Any, what: str, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or (value == 0 and not zero):
        raise ConfigError(f"{what} must be a {'non-negative' if zero else 'positive'} number of seconds, got {value!r}")
    return float(value)


def _ingress(raw: dict[str, Any], where: str) -> IngressSettings:
    return IngressSettings(
        replicas=_int(raw.get("replicas", 1), f"{where}: ingress.replicas", 1),
        max_body_bytes=_int(raw.get("max_body_bytes", 1 << 20), f"{where}: ingress.max_body_bytes", 1),
        default_max_tokens=_int(raw.get("default_max_tokens", 256), f"{where}: ingress.default_max_tokens", 1),
        max_model_len=_int(raw.get("max_model_len", 4096), f"{where}: ingress.max_model_len", 2),
    )


def _telemetry(raw: dict[str, Any], where: str) -> TelemetrySettings:
    if not isinstance(raw, dict) or set(raw) - {"otlp_endpoint", "traces", "top_tenants", "trace_sample_ratio"}:
        raise ConfigError(f"{where}: telemetry takes otlp_endpoint, traces, top_tenants and trace_sample_ratio")
    endpoint = raw.get("otlp_endpoint") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None
    if endpoint is not None and not isinstance(endpoint, str):
        raise ConfigError(f"{where}: telemetry.otlp_endpoint must be a URL")
    traces = raw.get("traces", "off")
    traces = "off" if traces is False else traces  # YAML reads a bare off as false
    if traces not in ("off", "memory"):
        raise ConfigError(f"{where}: telemetry.traces must be off or memory, got {traces!r}")
    top = _int(raw.get("top_tenants", 20), f"{where}: telemetry.top_tenants", 1)
    ratio = raw.get("trace_sample_ratio", 1.0)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 1:
        raise ConfigError(f"{where}: telemetry.trace_sample_ratio must be in [0, 1], got {ratio!r}")
    return TelemetrySettings(endpoint, traces, top, float(ratio))


def _state(raw: dict[str, Any], where: str) -> StateSettings:
    if not isinstance(raw, dict) or set(raw) - {"redis_url", "key_prefix", "snapshot_interval_s", "connect_timeout_s"}:
        raise ConfigError(f"{where}: state takes redis_url, key_prefix, snapshot_interval_s and connect_timeout_s")
    url = secret_from_env("FAIRGATE_REDIS_URL") or raw.get("redis_url")
    if url is not None and (not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://"))):
        raise ConfigError(f"{where}: state.redis_url must be a redis://, rediss:// or unix:// URL")
    times = {}
    for name, default in (("snapshot_interval_s", 1.0), ("connect_timeout_s", 60.0)):
        value = raw.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"{where}: state.{name} must be a positive number of seconds, got {value!r}")
        times[name] = float(value)
    prefix = raw.get("key_prefix", "fairgate")
    if not isinstance(prefix, str) or not prefix:
        raise ConfigError(f"{where}: state.key_prefix must be a non-empty string")
    return StateSettings(url or None, prefix, **times)


def _optional_int(value: Any, what: str) -> int | None:
    return None if value is None else _int(value, what, 1)


def _int(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{what} must be a whole number >= {minimum}, got {value!r}")
    return value
