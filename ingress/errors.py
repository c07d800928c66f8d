"""How the core's rejections reach clients: OpenAI-shaped errors with the right status."""

from __future__ import annotations

import math

from fairgate.common.openai_errors import ApiError
from fairgate.core import reasons

RETRY_AFTER_S = 60
BUSY_RETRY_AFTER_S = 5


# reason -> (status, message, error type, code, Retry-After seconds or None)
_REJECTIONS: dict[str, tuple[int, str, str, str, int | None]] = {
    reasons.REJECT_RATE_LIMITED: (
        429,
        "rate limit reached for this tenant's requests per minute",
        "rate_limit_error",
        "rate_limit_exceeded",
        RETRY_AFTER_S,
    ),
    reasons.REJECT_TENANT_QUEUE_FULL: (
        429,
        "too many of this tenant's requests are already waiting; retry after some finish",
        "rate_limit_error",
        "tenant_queue_full",
        BUSY_RETRY_AFTER_S,
    ),
    reasons.REJECT_QUEUE_FULL: (
        503,
        "the gateway's queue is full; retry later",
        "server_error",
        "queue_full",
        BUSY_RETRY_AFTER_S,
    ),
    reasons.REJECT_QUEUE_TIMEOUT: (
        503,
        "the request waited longer than the gateway's maximum queueing time; retry later",
        "server_error",
        "queue_timeout",
        BUSY_RETRY_AFTER_S,
    ),
    reasons.FINISH_WORKER_LOST: (
        502,
        "the worker running this request failed; it was stopped",
        "server_error",
        "worker_failed",
        None,
    ),
    "dispatcher_unavailable": (
        503,
        "the dispatcher is restarting and did not come back in time; retry later",
        "server_error",
        "dispatcher_unavailable",
        BUSY_RETRY_AFTER_S,
    ),
}


def rejection_error(reason: str, message: str = "", retry_after_s: float = 0.0) -> ApiError:
    """The client's error for a refusal; ``message`` and ``retry_after_s``: the refusal's own, when it
    has them (a quota's)."""
    retry_after = {"Retry-After": str(max(1, math.ceil(retry_after_s)))}
    if reason == reasons.REJECT_QUOTA:
        message = message or "this tenant's token quota has too little left for this request"
        return ApiError(429, message, type_="insufficient_quota", code="insufficient_quota", headers=retry_after)
    if reason == reasons.REJECT_OBJECTIVE:
        message = message or "this request's class cannot meet its first-token objective now; retry later"
        return ApiError(503, message, type_="server_error", code="objective_unreachable", headers=retry_after)
    if reason == reasons.REJECT_UNKNOWN_KEY:
        return ApiError(401, "incorrect API key provided", code="invalid_api_key")
    if reason == reasons.REJECT_TOO_LARGE:
        return ApiError(
            400,
            "the prompt plus max_tokens is larger than any worker's KV cache",
            param="max_tokens",
            code="context_length_exceeded",
        )
    status, message, type_, code, retry = _REJECTIONS.get(
        reason, (503, f"request refused: {reason}", "server_error", reason, None)
    )
    headers = None if retry is None else {"Retry-After": str(retry)}
    return ApiError(status, message, type_=type_, code=code, headers=headers)
