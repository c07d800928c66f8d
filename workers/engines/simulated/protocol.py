"""The simulated engine's OpenAI request shapes and their validation: the subset of the protocol it
serves (one choice, text only), strictly typed, every refusal an OpenAI-shaped 400."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


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
