"""The response names the tier it was served in (OpenAI's ``service_tier``), as OpenAI's API does.

The engine's bytes are relayed as they come; only this one field is set on the way, without parsing:
an engine's ``"service_tier":null`` is filled in, and a JSON object or SSE event without the field
gets it first. Error bodies are left alone.
"""

from __future__ import annotations

import json

_NULLS = (b'"service_tier":null', b'"service_tier": null')
_FIELD = b'"service_tier"'


def echo_tier(data: bytes, tier: str, stream: bool) -> bytes:
    """``data`` (a JSON body, or SSE events) with ``service_tier`` set to ``tier``."""
    if not tier or not data:
        return data
    value = b'"service_tier":' + json.dumps(tier).encode()
    for null in _NULLS:
        if null in data:
            return data.replace(null, value)
    if _FIELD in data:
        return data
    if stream:
        return data.replace(b"data: {", b"data: {" + value + b",")
    return b"{" + value + b"," + data[1:] if data.startswith(b"{") and data[1:2] != b"}" else data
