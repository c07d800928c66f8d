"""The model's own Hugging Face tokenizer and chat template: the ingress counts prompt tokens exactly as
vLLM will (a templated prompt is tokenized without adding special tokens again)."""

from __future__ import annotations

from typing import Any


class HuggingFacePrompts:
    def __init__(self, model_path: str) -> None:
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(model_path)

    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        return self._tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)

    def count(self, text: str, templated: bool) -> int:
        return len(self.tokens(text, templated))

    def tokens(self, text: str, templated: bool) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=not templated)["input_ids"])
