"""OpenAI request shapes, their validation, and the error type: independent of the web framework's
defaults, every refusal is OpenAI-shaped JSON with the right status, so the official client raises the
right exception."""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class ApiError(Exception):
    """An error to return as ``{"error": {...}}`` with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


INT32_MAX = 2**31 - 1
INT64 = 2**63


class _Sampling(BaseModel):
    """Fields shared by both endpoints. Unknown fields are ignored, as OpenAI-compatible servers do.
    Numbers are refused outside what the engine takes (NaN and infinities included), so that nothing
    admitted can fail on its way to the worker."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)  # "yes" is not true, "5" not 5
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-INT64, lt=INT64)
    stop: str | list[str] | None = None
    n: int = 1
    ignore_eos: bool = False

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, stop: str | list[str] | None) -> str | list[str] | None:
        values = [stop] if isinstance(stop, str) else stop or []
        if len(values) > 4 or any(not s for s in values):
            raise ValueError("stop must be up to 4 non-empty strings")
        return stop

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(_Sampling):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[str]) -> str | list[str]:
        if isinstance(prompt, list) and len(prompt) != 1:
            raise ValueError("exactly one prompt is supported")
        if not (prompt if isinstance(prompt, str) else prompt[0]):
            raise ValueError("the prompt must not be empty")
        return prompt

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)

    def message_dicts(self) -> list[dict[str, str]]:
        """The conversation as a chat template takes it."""
        return [{"role": m.role, "content": m.text()} for m in self.messages]


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


def parse_body(model: type[_Sampling], body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        message = first.get("msg", "invalid request")
        if first.get("type") == "missing":
            message = f"missing required field '{param}'"
        elif param:
            message = f"invalid '{param}': {message}"
        raise ApiError(400, message, param=param, code="invalid_request") from None
