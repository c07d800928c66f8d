"""The admin API's request bodies: creating and changing tenants (admin key only)."""

from __future__ import annotations

import secrets
from typing import Any

from ingress.openai_api import ApiError


def tenant_change(body: Any, creating: bool) -> tuple[str | None, float | None, str | None, str | None]:
    """Validate a create/update body: returns (name, weight, new API key or None, cache group or None)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_request")
    allowed = {"name", "weight", "api_key", "cache_group"} if creating else {"weight", "api_key", "cache_group"}
    unknown = set(body) - allowed
    if unknown:
        raise ApiError(400, f"unknown field '{sorted(unknown)[0]}'", param=sorted(unknown)[0], code="invalid_request")
    name = body.get("name")
    if creating and not isinstance(name, str):
        raise ApiError(400, "missing required field 'name'", param="name", code="invalid_request")
    weight = body.get("weight")
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, int | float)):
        raise ApiError(400, "invalid 'weight': a positive number is needed", param="weight", code="invalid_request")
    key = body.get("api_key")
    if key is not None and (not isinstance(key, str) or len(key) < 16):
        raise ApiError(400, "invalid 'api_key': at least 16 characters", param="api_key", code="invalid_request")
    if creating and key is None:
        key = "fg-" + secrets.token_urlsafe(24)
    group = body.get("cache_group")
    if group is not None and (not isinstance(group, str) or len(group) > 64):
        raise ApiError(
            400, "invalid 'cache_group': a name of at most 64 characters", param="cache_group", code="invalid_request"
        )
    return name, None if weight is None else float(weight), key, group
