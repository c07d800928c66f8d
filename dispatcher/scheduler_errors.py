"""How the core's rejections reach clients: OpenAI-shaped errors with the right status."""

from __future__ import annotations

from dispatcher.core import (
    REJECT_QUEUE_FULL,
    REJECT_QUEUE_TIMEOUT,
    REJECT_RATE_LIMITED,
    REJECT_TENANT_QUEUE_FULL,
    REJECT_TOO_LARGE,
)
from dispatcher.openai_api import ApiError

RETRY_AFTER_S = 60
BUSY_RETRY_AFTER_S = 5


def rejection_error(reason: str) -> ApiError:
    if reason == REJECT_RATE_LIMITED:
        return ApiError(
            429,
            "rate limit reached for this tenant's requests per minute",
            type_="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    if reason == REJECT_TOO_LARGE:
        return ApiError(
            400,
            "the prompt plus max_tokens is larger than any worker's KV cache",
            param="max_tokens",
            code="context_length_exceeded",
        )
    if reason == REJECT_TENANT_QUEUE_FULL:
        return ApiError(
            429,
            "too many of this tenant's requests are already waiting; retry after some finish",
            type_="rate_limit_error",
            code="tenant_queue_full",
            headers={"Retry-After": str(BUSY_RETRY_AFTER_S)},
        )
    if reason in (REJECT_QUEUE_FULL, REJECT_QUEUE_TIMEOUT):
        message = (
            "the gateway's queue is full"
            if reason == REJECT_QUEUE_FULL
            else "the request waited longer than the gateway's maximum queueing time"
        )
        return ApiError(
            503,
            f"{message}; retry later",
            type_="server_error",
            code=reason,
            headers={"Retry-After": str(BUSY_RETRY_AFTER_S)},
        )
    return ApiError(503, f"request refused: {reason}", type_="server_error", code=reason)
