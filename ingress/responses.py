"""OpenAI response shapes: completion objects, streamed chunks as server-sent events, usage."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from common.tracing import RequestTrace
from ingress.generation import Outcome, WorkerLost
from ingress.openai_api import ApiError


def envelope(rid: str, obj: str, model: str, created: int, choices: list[dict[str, Any]], **extra: Any) -> dict:
    """The fields every completion object and chunk share."""
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices, **extra}


def completion_chunk(rid: str, model: str, created: int, text: str, finish: str | None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return envelope(rid, "text_completion", model, created, [choice])


def chat_chunk(rid: str, model: str, created: int, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return envelope(rid, "chat.completion.chunk", model, created, [choice])


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def now_s() -> int:
    return int(time.time())


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


async def sse_events(
    rid: str,
    chat: bool,
    model: str,
    text: AsyncIterator[str],
    outcome: Outcome,
    include_usage: bool,
    trace: RequestTrace,
    on_close: Callable[[], None] | None = None,
) -> AsyncIterator[str]:
    """The stream a client reads: text deltas as chunks, the finish reason, usage when asked for, and
    ``[DONE]``; a failure after the first byte becomes a final error event. ``on_close`` runs however
    the stream ends (closing ``text`` does nothing when the client left before it was first read)."""
    created = now_s()
    error = ""
    try:
        if chat:
            yield sse(chat_chunk(rid, model, created, {"role": "assistant", "content": ""}, None))
        async for piece in text:
            if chat:
                yield sse(chat_chunk(rid, model, created, {"content": piece}, None))
            else:
                yield sse(completion_chunk(rid, model, created, piece, None))
        final = (
            chat_chunk(rid, model, created, {}, outcome.finish_reason)
            if chat
            else completion_chunk(rid, model, created, "", outcome.finish_reason)
        )
        yield sse(final)
        if include_usage:
            obj = "chat.completion.chunk" if chat else "text_completion"
            tokens = usage(outcome.prompt_tokens, outcome.completion_tokens)
            yield sse(envelope(rid, obj, model, created, [], usage=tokens))
    except WorkerLost as exc:
        error = "worker_failed"
        yield sse(ApiError(502, str(exc), type_="server_error", code="worker_failed").body())
    except ApiError as exc:  # placing it again after its worker was lost failed
        error = exc.code or "error"
        yield sse(exc.body())
    except BaseException as exc:  # the client went away
        error = type(exc).__name__
        raise
    finally:
        await text.aclose()  # type: ignore[attr-defined]
        if on_close is not None:
            on_close()
        trace.finish(outcome.prompt_tokens, outcome.completion_tokens, outcome.finish_reason, error)
    yield "data: [DONE]\n\n"


def whole_response(rid: str, chat: bool, model: str, content: str, outcome: Outcome) -> dict[str, Any]:
    """The non-streaming completion object."""
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": None,
            "finish_reason": outcome.finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": outcome.finish_reason}
        obj = "text_completion"
    tokens = usage(outcome.prompt_tokens, outcome.completion_tokens)
    return envelope(rid, obj, model, now_s(), [choice], usage=tokens)
