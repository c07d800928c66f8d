"""From a parsed OpenAI request to what the dispatcher is asked to admit: the engine's prompt text, its
token count (the engine's own tokenizer and chat template, through its plug-in), ``max_tokens`` (the
default when absent), and the context check."""

from __future__ import annotations

from typing import Any

from ingress.openai_api import ApiError, ChatRequest, CompletionRequest
from workers.engines import engine_for


def context_limit(gateway: dict[str, Any]) -> int:
    """Prompt + max_tokens a request may ask for: the ingress limit, and the engine's when it is smaller."""
    limit = gateway["ingress"]["max_model_len"]
    workers = gateway["workers"]
    engine_limit = engine_for(workers["engine"]).context_limit(workers["settings"])
    return min(limit, engine_limit) if engine_limit else limit


class Prompting:
    def __init__(self, gateway: dict[str, Any]) -> None:
        workers = gateway["workers"]
        self._estimator = engine_for(workers["engine"]).prompts(workers["settings"])
        self._default_max_tokens = int(gateway["ingress"]["default_max_tokens"])
        self.context_limit = context_limit(gateway)

    def prepare(self, req: ChatRequest | CompletionRequest) -> tuple[str, int, int]:
        """(prompt text, prompt tokens, max_tokens) of a request; 400 when it does not fit the context."""
        chat = isinstance(req, ChatRequest)
        prompt = self._estimator.chat_prompt(req.message_dicts()) if chat else req.prompt_text()
        prompt_tokens = self._estimator.count(prompt, templated=chat)
        max_tokens = (req.max_completion_tokens if chat else None) or req.max_tokens or self._default_max_tokens
        limit = self.context_limit
        if prompt_tokens + max_tokens > limit:
            raise ApiError(
                400,
                f"this model's maximum context length is {limit} tokens; the request has {prompt_tokens} prompt "
                f"tokens and asks for {max_tokens} more",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return prompt, prompt_tokens, max_tokens
