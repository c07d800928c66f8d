"""The simulated engine's OpenAI response shapes: completion objects, streamed chunks, usage."""

from __future__ import annotations

import json
import time
from typing import Any


def envelope(rid: str, obj: str, model: str, created: int, choices: list[dict[str, Any]], **extra: Any) -> dict:
    """The fields every completion object and chunk share."""
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices, **extra}


def completion_chunk(rid: str, model: str, created: int, text: str, finish: str | None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return envelope(rid, "text_completion", model, created, [choice])


def chat_chunk(rid: str, model: str, created: int, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return envelope(rid, "chat.completion.chunk", model, created, [choice])


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object, with the prompt tokens found in the prefix cache (what money is billed on)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def now_s() -> int:
    return int(time.time())


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


def whole_response(
    rid: str,
    chat: bool,
    model: str,
    content: str,
    finish: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
) -> dict[str, Any]:
    """The non-streaming completion object."""
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": None,
            "finish_reason": finish,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    tokens = usage(prompt_tokens, completion_tokens, cached_tokens)
    return envelope(rid, obj, model, now_s(), [choice], usage=tokens)
