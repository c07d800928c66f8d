"""What a worker lets through of a client's OpenAI request body: what the ticket admitted, whatever the
body says (docs/architecture.md, "a worker").

- output: ``max_tokens`` (and ``max_completion_tokens``) at most the admitted budget shared among the
  admitted choices, the budget itself when absent;
- choices: ``n`` (and ``best_of``) at most as admitted;
- the request id and the prefix-cache salt are the gateway's, never the client's;
- no engine-internal fields: nothing that moves KV between engines, changes the engine's priority,
  runs the client's code or templates in the engine, or bypasses its tokenizer.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

ENDPOINT_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}

# Fields a client may not set, whatever the engine would do with them.
ENGINE_INTERNAL_FIELDS = frozenset(
    {
        "request_id",
        "cache_salt",
        "priority",
        "kv_transfer_params",
        "vllm_xargs",
        "data_parallel_rank",
        "logits_processors",
        "chat_template",
        "mm_processor_kwargs",
        "prompt_embeds",
        "return_token_ids",
        "return_tokens_as_token_ids",
        "structured_outputs_config",
    }
)


class BodyRefused(ValueError):
    """A body the worker cannot serve as admitted (a 400 for the client)."""


def choices_of(body: dict[str, Any]) -> int:
    """Sequences a request makes the engine generate: ``n``, or ``best_of`` when larger."""
    n = body.get("n")
    best_of = body.get("best_of")
    counts = [v for v in (n, best_of) if isinstance(v, int) and not isinstance(v, bool)]
    return max([1, *counts])


def admitted_body(body: Any, max_tokens: int, choices: int, endpoint: str) -> dict[str, Any]:
    """The body to serve: the client's, with the admitted limits in force and engine-internal fields
    gone. ``max_tokens``: output tokens admitted for all choices together."""
    if not isinstance(body, dict):
        raise BodyRefused("the request body must be a JSON object")
    if body.get("use_beam_search"):  # a search of many sequences the admission never sized
        raise BodyRefused("beam search is not served through the gateway")
    asked = choices_of(body)
    if asked > max(1, choices):
        raise BodyRefused(f"the request asks for {asked} choices; {choices} were admitted")
    out = {k: v for k, v in body.items() if k not in ENGINE_INTERNAL_FIELDS}
    per_choice = max(1, max_tokens // max(1, asked))
    fields = ("max_tokens", "max_completion_tokens") if endpoint == "chat" else ("max_tokens",)
    for name in fields:
        value = out.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > per_choice:
            out[name] = per_choice
    if not any(isinstance(out.get(name), int) for name in fields):
        out[fields[-1]] = per_choice
    return out


def tenant_cache_salt(secret: bytes, tenant: str) -> str:
    """The prefix-cache salt of a tenant: tenants never share cached prefixes (no one learns from
    timing what another sent), and no one can compute another tenant's salt without the secret."""
    return hmac.new(secret, b"cache-salt:" + tenant.encode(), hashlib.sha256).hexdigest()[:32]
