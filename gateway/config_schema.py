"""Checking the gateway's configuration: one YAML file, validated into the typed sections of
``fairgate.common.config`` (``validate``), with what only the core can check (policies, the tree, the
request classes) checked by the core itself. The workers' engine-specific settings are the engine
plug-in's to check (``fairgate.gateway.config`` does it at load time), so nothing here knows any
engine. Errors name the field and the value: ``ConfigError``.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from fairgate.common.config import (
    GatewayConfig,
    IngressSettings,
    ModelPool,
    NetworkSettings,
    PriceConfig,
    QuotaConfig,
    SchedulerSettings,
    ShardSettings,
    StateSettings,
    TelemetrySettings,
    WorkerSettings,
)
from fairgate.common.key_hashing import key_digest
from fairgate.common.sections import ConfigError, M, read_yaml, secret_from_env, validate_section
from fairgate.common.tenant_schema import (
    MIN_KEY_CHARS,
    AdapterConfig,
    ClassConfig,
    NodeConfig,
    TenantConfig,
    TenantEntry,
)
from fairgate.core import SchedulerConfig, cost_from_spec, make_placement, make_policy
from fairgate.core.tree import TreeError, check_tree

ADMIN = "(admin)"  # where validate reports a generated admin key


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
        shards = validate_section(ShardSettings, raw.get("shards") or {}, "shards")
        quotas = _entries(QuotaConfig, raw.get("quotas"), "quotas")
        prices = _prices(raw.get("prices"), models)
        adapters = _entries(AdapterConfig, raw.get("adapters"), "adapters")
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    generated: dict[str, str] = {}
    tenants = _tenants(raw, where, generated)
    _check_tree(tree, tenants, classes, where)
    _check_quotas(quotas, tenants, tree, where)
    if quotas and shards.count > 1:
        raise ConfigError(
            f"{where}: quotas are kept by one dispatcher: with shards.count {shards.count} they are not"
            " supported yet (docs/shards.md)"
        )
    if (tree or any(t.parent for t in tenants)) and not make_policy(scheduler.policy).tree:
        raise ConfigError(
            f"{where}: tree: a tenant tree needs a policy that orders by counters, not {scheduler.policy!r}"
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
        shards=shards,
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


def _scheduler(raw: dict[str, Any], classes: list[ClassConfig]) -> SchedulerConfig:
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
        policy=make_policy(settings.policy).spec,  # a mapping or text: kept as the text that builds it
        cost=cost_from_spec(settings.cost.model_dump(exclude_none=True)),
        placement=make_placement(settings.placement).spec,
        strict_head_of_line=settings.strict_head_of_line,
        max_queued_per_tenant=limits.max_queued_per_tenant,
        max_queued=limits.max_queued,
        max_queue_s=limits.max_queue_s,
        classes=tuple(c.request_class() for c in classes),
    )


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
