"""What the ingress reads of an OpenAI request: strict JSON, and the few fields admission needs (the
model, the size to reserve and charge). The body itself goes to the worker as it came."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fairgate.common.openai_errors import ApiError

INT32_MAX = 2**31 - 1
MAX_CHOICES = 16  # n / best_of


class _BodyFields(BaseModel):
    """The fields admission needs. Everything else is the engine's: its own OpenAI layer validates and
    serves it (tools, structured outputs, logprobs, penalties...), so nothing is silently dropped."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)  # "5" is not 5
    model: str = Field(min_length=1)
    stream: bool = False
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    best_of: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    service_tier: str | None = Field(default=None, max_length=32)  # its request class (OpenAI's field)

    def choices(self) -> int:
        return max(self.n, self.best_of or 1)


class ChatFields(_BodyFields):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)

    @field_validator("messages")
    @classmethod
    def _roles(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if any(not isinstance(m.get("role"), str) for m in messages):
            raise ValueError("every message needs a role")
        return messages

    def asked_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionFields(_BodyFields):
    prompt: str | list[str] | list[int]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str) and len(prompt) != 1:
            raise ValueError("exactly one prompt is supported")
        if not prompt or prompt == [""]:
            raise ValueError("the prompt must not be empty")
        return prompt

    def asked_max_tokens(self) -> int | None:
        return self.max_tokens


MAX_JSON_DEPTH = 32


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> Any:
    """A request body as JSON, strictly: UTF-8, no NaN or Infinity, nesting at most ``MAX_JSON_DEPTH``
    deep, and every string encodable (a lone UTF-16 surrogate such as "\\ud800" is not text). Anything
    else is the client's 400, before anything is reserved for it."""
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply", code="invalid_json") from None
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ApiError(400, f"the request body is nested deeper than {MAX_JSON_DEPTH} levels", code="invalid_json")
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict):
            for key, inner in item.items():
                _check_text(key)
                stack.append((inner, depth + 1))
        elif isinstance(item, list):
            stack.extend((inner, depth + 1) for inner in item)
    return value


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "the request has a string that is not valid Unicode (a lone surrogate)") from None
