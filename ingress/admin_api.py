"""The admin API's request bodies: creating and changing tenants, tenant tree nodes and LoRA adapters
(admin key only)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from fairgate.common.tenant_schema import MAX_GROUP_CHARS, MIN_KEY_CHARS
from fairgate.ingress.openai_api import ApiError


@dataclass(frozen=True)
class TenantChange:
    """A validated create/update body (None: not given, keep)."""

    name: str | None
    weight: float | None
    api_key: str | None
    cache_group: str | None
    parent: str | None
    classes: list[str] | None


TENANT_FIELDS = {"weight", "api_key", "cache_group", "parent", "classes"}
NODE_FIELDS = {"parent", "weight"}
ADAPTER_FIELDS = {"path", "nodes"}


@dataclass(frozen=True)
class AdapterChange:
    """A validated adapter create/update body (None: not given, keep; the base model is set at creation)."""

    name: str | None
    base_model: str | None
    path: str | None
    nodes: list[str] | None


def adapter_change(body: Any, creating: bool) -> AdapterChange:
    """Validate an adapter create/update body; the dispatcher's registry checks the rest (the base
    model, the nodes, the name taken) as it checks the configuration's."""
    _fields(body, ADAPTER_FIELDS | ({"name", "base_model"} if creating else set()))
    name = _name(body, creating)
    base = body.get("base_model")
    if creating and not isinstance(base, str):
        raise ApiError(400, "missing required field 'base_model'", param="base_model", code="invalid_request")
    path = body.get("path")
    if (creating or path is not None) and not isinstance(path, str):
        raise ApiError(400, "'path' must be where the adapter's weights are", param="path", code="invalid_request")
    nodes = body.get("nodes")
    if (creating or nodes is not None) and (not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes)):
        raise ApiError(
            400, "'nodes' must list the tree nodes or tenants that may use it", param="nodes", code="invalid_request"
        )
    return AdapterChange(name, base, path, nodes)


def tenant_change(body: Any, creating: bool) -> TenantChange:
    """Validate a tenant create/update body (a new API key is made for a create without one)."""
    _fields(body, TENANT_FIELDS | ({"name"} if creating else set()))
    name = _name(body, creating)
    key = body.get("api_key")
    if key is not None and (not isinstance(key, str) or len(key) < MIN_KEY_CHARS):
        raise ApiError(
            400, f"invalid 'api_key': at least {MIN_KEY_CHARS} characters", param="api_key", code="invalid_request"
        )
    if creating and key is None:
        key = "fg-" + secrets.token_urlsafe(24)
    group = body.get("cache_group")
    if group is not None and (not isinstance(group, str) or len(group) > MAX_GROUP_CHARS):
        raise ApiError(
            400,
            f"invalid 'cache_group': a name of at most {MAX_GROUP_CHARS} characters",
            param="cache_group",
            code="invalid_request",
        )
    classes = body.get("classes")
    if classes is not None and (not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)):
        raise ApiError(400, "invalid 'classes': a list of request class names", param="classes", code="invalid_request")
    return TenantChange(name, _weight(body), key, group, _parent(body), classes)


def node_change(body: Any, creating: bool) -> tuple[str | None, str | None, float | None]:
    """Validate a tree node create/update body: (name, parent, weight)."""
    _fields(body, NODE_FIELDS | ({"name"} if creating else set()))
    return _name(body, creating), _parent(body), _weight(body)


def _fields(body: Any, allowed: set[str]) -> None:
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_request")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(400, f"unknown field '{unknown[0]}'", param=unknown[0], code="invalid_request")


def _name(body: dict[str, Any], creating: bool) -> str | None:
    name = body.get("name")
    if creating and not isinstance(name, str):
        raise ApiError(400, "missing required field 'name'", param="name", code="invalid_request")
    return name


def _weight(body: dict[str, Any]) -> float | None:
    weight = body.get("weight")
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, int | float)):
        raise ApiError(400, "invalid 'weight': a positive number is needed", param="weight", code="invalid_request")
    return None if weight is None else float(weight)


def _parent(body: dict[str, Any]) -> str | None:
    parent = body.get("parent")
    if parent is not None and not isinstance(parent, str):
        raise ApiError(
            400, "invalid 'parent': a tree node's name ('' for the root)", param="parent", code="invalid_request"
        )
    return parent
