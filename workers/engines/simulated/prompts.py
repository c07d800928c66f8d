"""The simulated engine's prompts: a plain role-tagged chat template, counted by its own tokenizer."""

from __future__ import annotations

from typing import Any

from fairgate.workers.engines.simulated.tokenizer import count_tokens, token_ids


def message_text(content: Any) -> str:
    """A message's content as text: a string, or the text of its parts."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


class SimulatedPrompts:
    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        turns = [f"<|{m['role']}|> {message_text(m.get('content'))}" for m in messages]
        return "\n".join([*turns, "<|assistant|>"])

    def count(self, text: str, templated: bool) -> int:
        return count_tokens(text)

    def tokens(self, text: str, templated: bool) -> list[int]:
        return token_ids(text)
