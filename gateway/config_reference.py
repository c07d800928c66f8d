"""The configuration reference, written from the schema itself (``fairgate.gateway.config_schema``, the tenant
schema and each engine plug-in's settings model): every key with its type, default, limits and meaning,
so that the page (``docs/configuration.md``, filled in when the docs are built) cannot drift from what
the gateway accepts. ``python -m fairgate.gateway.config_reference`` prints it."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fairgate.common.config import (
    AutoscalingSettings,
    CostSettings,
    IngressSettings,
    LimitsSettings,
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
from fairgate.common.tenant_schema import AdapterConfig, ClassConfig, NodeConfig, TenantEntry
from fairgate.core.placement.base import PLACEMENTS
from fairgate.core.policies.base import POLICIES
from fairgate.workers.engines import engine_for, engine_names

# keys of the top level that are not scheduler settings: (key, type, what it holds)
TOP_LEVEL = [
    ("model", "string", "the model name of a one-model gateway (default fairgate-sim)"),
    ("workers", "mapping", "its worker replicas: [workers](#workers)"),
    ("models", "list", "instead of model and workers: one pool per model, [models](#models)"),
    ("tenants", "list", "the tenants: [tenants](#tenants)"),
    ("tenants_file", "path", "instead of tenants: a YAML file holding that list (a mounted Secret)"),
    ("tree", "list", "nodes of the tenant tree, parents first: [tree](#tree)"),
    ("classes", "list", "request classes: [classes](#classes)"),
    (
        "admin_api_key",
        "string",
        "the admin API's key, 16 characters or more (FAIRGATE_ADMIN_KEY wins; none: generated)",
    ),
    ("ingress", "mapping", "the HTTP front: [ingress](#ingress)"),
    ("state", "mapping", "durable state: [state](#state)"),
    ("telemetry", "mapping", "traces and metrics: [telemetry](#telemetry)"),
    ("network", "mapping", "the internal endpoints' ports: [network](#network)"),
    ("shards", "mapping", "dispatcher shards: [shards](#shards)"),
]

SECTIONS: list[tuple[str, type[BaseModel], str]] = [
    ("cost", CostSettings, "top-level `cost:`"),
    ("limits", LimitsSettings, "top-level `limits:`"),
    ("workers", WorkerSettings, "top-level `workers:`, or each entry's `workers:` under `models:`"),
    ("autoscaling", AutoscalingSettings, "`workers.autoscaling:`"),
    ("models", ModelPool, "each entry of `models:`"),
    ("tenants", TenantEntry, "each entry of `tenants:` (or of the `tenants_file`)"),
    ("tree", NodeConfig, "each entry of `tree:`"),
    ("classes", ClassConfig, "each entry of `classes:`"),
    ("quotas", QuotaConfig, "each entry of `quotas:`"),
    ("adapters", AdapterConfig, "each entry of `adapters:`"),
    ("prices", PriceConfig, "each model's entry under `prices:` (money per million tokens)"),
    ("ingress", IngressSettings, "`ingress:`"),
    ("state", StateSettings, "`state:` (FAIRGATE_REDIS_URL wins over `redis_url`)"),
    ("telemetry", TelemetrySettings, "`telemetry:` (OTEL_EXPORTER_OTLP_ENDPOINT fills `otlp_endpoint`)"),
    ("network", NetworkSettings, "`network:`"),
    ("shards", ShardSettings, "`shards:` (`fairgate serve --dispatchers` sets `count`)"),
]


def type_name(annotation: Any) -> str:
    """A field's type as a reader of YAML knows it."""
    if annotation is None or annotation is type(None):
        return "none"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return " \\| ".join(f"`{v}`" for v in typing.get_args(annotation))
    if origin in (list, tuple):
        return "list"
    if origin is dict or annotation is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(annotation, str(annotation))


def default_text(info: FieldInfo) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "see below"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if value in ({}, [], (), ""):
        return "empty"
    if isinstance(value, dict):
        return "a mapping (see what it is)" if len(value) > 2 else f"`{value}`"
    return f"`{value}`"


def limits_text(info: FieldInfo) -> str:
    words = []
    for rule in info.metadata:
        for attr, sign in (
            ("gt", ">"),
            ("ge", ">="),
            ("lt", "<"),
            ("le", "<="),
            ("min_length", "length >="),
            ("max_length", "length <="),
        ):
            value = getattr(rule, attr, None)
            if value is not None:
                words.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    return ", ".join(words)


def section_table(model: type[BaseModel], skip: frozenset[str] = frozenset()) -> str:
    rows = ["| key | type | default | limits | what it is |", "|---|---|---|---|---|"]
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        cells = [f"`{name}`", type_name(info.annotation), default_text(info), limits_text(info), info.description or ""]
        rows.append("| " + " | ".join(c.replace("\n", " ") for c in cells) + " |")
    return "\n".join(rows)


def doc_of(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").split())


PLUGINS_INTRO = (
    "A policy or placement is a plug-in, named with its parameters: as text, `name` or `name:value` (the"
    " first parameter) or `name:key=value,key=value`, or as a mapping, `{name: vtc-locality, slack: 500}`."
    " An engine is named by `workers.engine` and takes the rest of the `workers` section as its parameters"
    " (its section below). Every registered plug-in is listed here, from the registries themselves."
)


def plugins_table(rows: list[dict[str, Any]]) -> str:
    """Plug-ins as the registries describe them: how each is written, its parameters, what it does."""
    out = ["| written | parameters | what it is |", "|---|---|---|"]
    for row in rows:
        params = "; ".join(
            f"`{p['name']}` ({p['type']}, "
            + ("required" if p["required"] else f"default `{p['default']}`")
            + "): "
            + p["doc"]
            for p in row["params"]
        )
        out.append(f"| `{row['usage']}` | {params or 'none'} | {row['summary']} |")
    return "\n".join(out)


def reference_markdown() -> str:
    """The whole reference: the top level, the plug-ins, each section, each engine's own keys."""
    out = ["## Top level", "", doc_of(SchedulerSettings), "", section_table(SchedulerSettings), ""]
    out += ["The other top-level keys:", "", "| key | type | what it holds |", "|---|---|---|"]
    out += [f"| `{key}` | {kind} | {what} |" for key, kind, what in TOP_LEVEL]
    out += ["", "## Plug-ins", "", PLUGINS_INTRO, "", "Fairness policies (`policy:`):", ""]
    out += [
        plugins_table(POLICIES.describe()),
        "",
        "Placement rules (`placement:`):",
        "",
        plugins_table(PLACEMENTS.describe()),
    ]
    for name, model, where in SECTIONS:
        out += ["", f"## {name}", "", f"Where: {where}. {doc_of(model)}", ""]
        out.append(section_table(model, frozenset({"settings"}) if model is WorkerSettings else frozenset()))
    for engine in engine_names():
        plugin = engine_for(engine)
        if plugin.settings_model is None:
            continue
        where = f"`workers.{plugin.settings_section}:`" if plugin.settings_section else "`workers:`, beside its keys"
        out += [
            "",
            f"## Engine `{engine}`",
            "",
            f"With `engine: {engine}`, under {where}. {doc_of(plugin.settings_model)}",
        ]
        out += ["", section_table(plugin.settings_model)]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
