"""Loading the gateway's configuration: a YAML file (or the embedded ``default_config.yaml``) checked
against the schema (``fairgate.gateway.config_schema``), then the workers' engine settings checked by the engine's own
plug-in. Everything that starts a gateway reads its configuration through here."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from fairgate.common.config import GatewayConfig, WorkerSettings
from fairgate.common.key_hashing import KeyHasher
from fairgate.common.sections import ConfigError, read_yaml
from fairgate.gateway.config_schema import adapter_models, check_adapters, validate
from fairgate.workers.engines import engine_for


def load_config(path: str | Path | None = None) -> tuple[GatewayConfig, dict[str, str]]:
    """Read a config (the embedded default when ``path`` is None). Returns the config and the API keys
    generated for tenants that had none (tenant -> key), to show once and never store."""
    if path is None:
        raw = yaml.safe_load(resources.files("fairgate.gateway").joinpath("default_config.yaml").read_text())
        return parse_config(raw, "default config")
    return parse_config(read_yaml(path), str(path))


def parse_config(raw: Any, where: str = "config") -> tuple[GatewayConfig, dict[str, str]]:
    """A configuration as parsed YAML, checked whole (the schema, then the engine's settings)."""
    config, generated = validate(raw, where)
    models = [
        m.model_copy(update={"workers": checked_workers(m.workers, m.workers.engine, m.workers.settings, where)})
        for m in config.models
    ]
    config = config.with_models(models)
    check_adapters(config, where)
    return config, generated


def checked_workers(workers: WorkerSettings, engine: str, settings: dict[str, Any], where: str) -> WorkerSettings:
    """``workers`` running ``engine`` with ``settings``, checked by that engine's plug-in."""
    try:
        checked = engine_for(engine).settings(settings)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return workers.model_copy(update={"engine": engine, "settings": checked})


def deployable(config: GatewayConfig, secret: str) -> GatewayConfig:
    """``config`` as the gateway's processes are built from it: its key digests keyed with the cluster
    secret, and whether each pool's workers take adapters (its engine's to say, before it travels to
    the dispatcher, which knows no engine)."""
    keyed = config.keyed(KeyHasher.from_environment(secret))
    return keyed.model_copy(update={"adapter_models": adapter_models(config.models)})


def with_engine(config: GatewayConfig, engine: str, settings: dict[str, Any], where: str) -> GatewayConfig:
    """``config`` with its first model running ``engine`` with ``settings``."""
    first = config.models[0]
    workers = checked_workers(first.workers, engine, settings, where)
    return config.with_models([first.model_copy(update={"workers": workers}), *config.models[1:]])
