"""The simulated engine's prompts: a plain role-tagged chat template, counted by its own tokenizer."""

from __future__ import annotations

from workers.engines.simulated.tokenizer import count_tokens


class SimulatedPrompts:
    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        turns = [f"<|{m['role']}|> {m['content']}" for m in messages]
        return "\n".join([*turns, "<|assistant|>"])

    def count(self, text: str, templated: bool) -> int:
        return count_tokens(text)
