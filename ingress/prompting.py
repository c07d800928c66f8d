"""From an OpenAI request to what the dispatcher is asked to admit: its prompt tokens estimated as the
engine will count them (its own tokenizer and chat template, tools included, through its plug-in), its
output budget (``max_tokens``, the default when absent, for every choice), and the context check.

The estimate only sizes the admission: the engine's exact count at start corrects the charge. A body
the template cannot render (the engine's layer will refuse it with its own 400) is estimated from its
text, so a malformed request never fails here with a 500. The same tokens give the prompt's block
hashes (``fairgate.common.prefix_hashes``): the dispatcher places and charges by cached prefix without text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fairgate.common.config import IngressSettings, WorkerSettings
from fairgate.common.openai_errors import ApiError
from fairgate.common.prefix_hashes import block_hashes, hash_block_tokens
from fairgate.ingress.openai_api import ChatFields, CompletionFields
from fairgate.workers.engines import engine_for

ROUGH_CHARS_PER_TOKEN = 3


def context_limit(ingress: IngressSettings, workers: WorkerSettings) -> int:
    """Prompt + max_tokens a request may ask for: the ingress limit, and the engine's when it is smaller."""
    limit = ingress.max_model_len
    engine_limit = engine_for(workers.engine).context_limit(workers.settings)
    return min(limit, engine_limit) if engine_limit else limit


@dataclass(frozen=True, slots=True)
class Admitted:
    """What the dispatcher reserves and charges for: every choice holds the prompt and its outputs."""

    prompt_tokens: int  # all choices
    max_tokens: int  # all choices
    choices: int
    prefix: tuple[int, ...] = ()  # the prompt's block hashes (unsalted: the dispatcher salts them)
    block_tokens: int = 0


class Prompting:
    def __init__(self, ingress: IngressSettings, workers: WorkerSettings, model: str = "") -> None:
        engine = engine_for(workers.engine)
        self._estimator = engine.prompts(workers.settings)
        self._default_max_tokens = ingress.default_max_tokens
        self.hash_block = hash_block_tokens(engine.block_size(workers.settings))
        self.model = model
        self.context_limit = context_limit(ingress, workers)

    def prompt(self, req: ChatFields | CompletionFields) -> tuple[int, list[int] | None]:
        """The prompt's token count, and its tokens when known."""
        if isinstance(req, CompletionFields):
            if isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], int):
                return len(req.prompt), list(req.prompt)
            text = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
            tokens = self._estimator.tokens(text, templated=False)
            return len(tokens), tokens
        try:
            prompt = self._estimator.chat_prompt(req.messages, req.tools)
            tokens = self._estimator.tokens(prompt, templated=True)
            return len(tokens), tokens
        except Exception:  # not renderable: the engine's layer gives the client its own 400
            return len(json.dumps(req.messages)) // ROUGH_CHARS_PER_TOKEN + 1, None

    def admit(self, req: ChatFields | CompletionFields) -> Admitted:
        """The admitted size of a request; 400 when it does not fit the context."""
        prompt_tokens, tokens = self.prompt(req)
        max_tokens = req.asked_max_tokens() or self._default_max_tokens
        limit = self.context_limit
        if prompt_tokens + max_tokens > limit:
            raise ApiError(
                400,
                f"this model's maximum context length is {limit} tokens; the request has {prompt_tokens} prompt "
                f"tokens and asks for {max_tokens} more",
                param="max_tokens",
                code="context_length_exceeded",
            )
        n = req.choices()
        prefix = block_hashes(tokens, self.hash_block, self.model) if tokens else ()
        return Admitted(prompt_tokens * n, max_tokens * n, n, prefix, self.hash_block if prefix else 0)
