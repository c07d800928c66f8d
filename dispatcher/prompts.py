"""Turning a request into the engine's prompt text, and counting its tokens, as the engine will.

The simulated engine has its own word tokenizer and a plain chat template; a vLLM engine uses the
model's Hugging Face tokenizer and chat template. The ingress counts prompt tokens before submitting
(the dispatcher charges them at dispatch); the engine's exact count comes back in its first report.
"""

from __future__ import annotations

from typing import Any, Protocol

from workers.engine.tokenizer import count_tokens


class PromptBuilder(Protocol):
    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """The chat template applied to the messages, ending with the assistant's turn."""
        ...

    def count(self, text: str, templated: bool) -> int:
        """Prompt tokens of ``text`` (a templated prompt already carries its special tokens)."""
        ...


class SimulatedPrompts:
    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        turns = [f"<|{m['role']}|> {m['content']}" for m in messages]
        return "\n".join([*turns, "<|assistant|>"])

    def count(self, text: str, templated: bool) -> int:
        return count_tokens(text)


class HuggingFacePrompts:
    def __init__(self, model_path: str) -> None:
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(model_path)

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        return self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def count(self, text: str, templated: bool) -> int:
        return len(self._tokenizer(text, add_special_tokens=not templated)["input_ids"])


def prompts_for(workers: dict[str, Any]) -> PromptBuilder:
    """The prompt builder matching the workers' engine (from the config's ``workers`` section)."""
    if workers["engine"] == "vllm":
        from workers.vllm_engine.settings import VllmSettings

        return HuggingFacePrompts(VllmSettings.from_dict(workers["vllm"]).model_path())
    return SimulatedPrompts()


def context_limit(gateway: dict[str, Any]) -> int:
    """Prompt + max_tokens a request may ask for: the ingress limit, and the engine's when it is smaller."""
    limit = gateway["ingress"]["max_model_len"]
    workers = gateway["workers"]
    if workers["engine"] == "vllm":
        from workers.vllm_engine.settings import VllmSettings

        engine_limit = VllmSettings.from_dict(workers["vllm"]).context_limit()
        if engine_limit:
            limit = min(limit, engine_limit)
    return limit
