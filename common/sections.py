"""Validating configuration sections (pydantic) into typed, frozen objects, with errors of one line that
name the field and the value; and the secrets they refer to. The shared floor: the gateway's schema
(``fairgate.gateway.config_schema``), the tenant entries (``fairgate.common.tenant_schema``) and each engine plug-in's
settings are all checked this way."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the field."""


class Section(BaseModel):
    """A section whose unknown keys are refused; numbers are numbers (no bools, no strings)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class OpenSection(Section):
    """A section that ignores keys it does not know (as it always has)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


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


MIN_SECRET_CHARS = 32  # the cluster secret: tickets, workers' credentials and the hops' keys derive from it


def checked_cluster_secret(secret: str, where: str = "FAIRGATE_CLUSTER_SECRET") -> str:
    """The cluster secret, refused when it is short enough to guess."""
    if len(secret) < MIN_SECRET_CHARS:
        raise ConfigError(f"{where} must be at least {MIN_SECRET_CHARS} characters (it signs every ticket)")
    return secret


M = TypeVar("M", bound=BaseModel)


def validate_section(model: type[M], raw: Any, name: str) -> M:
    """Validate one section (``name``: where it sits, e.g. ``workers.vllm``; "": the top level); the first problem
    becomes a ``ValueError`` of one clear line naming the field and the value."""
    if not isinstance(raw, dict):
        raise ValueError(f"{name} must be a mapping, got {raw!r}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(_explain(exc.errors()[0], name, model)) from None


def _explain(error: Any, section: str, model: type[BaseModel]) -> str:
    loc = [str(p) for p in error.get("loc", ()) if p != "settings"]
    field = ".".join([p for p in [section, *loc] if p])  # section "": the configuration's top level
    kind, ctx, value = error.get("type", ""), error.get("ctx") or {}, error.get("input")
    if kind == "extra_forbidden":
        owner = ".".join([p for p in [section, *loc[:-1]] if p]) or "the configuration"
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
