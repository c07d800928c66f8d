"""Closed-loop streaming clients for the chaos tests, and what became of each of their requests
(imports no Ray: ``tests/e2e/node_loss.py`` drives its own cluster and must set Ray's environment
before Ray is imported)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

PROMPT = "word " * 60  # 60 prompt tokens for the simulated tokenizer
MAX_TOKENS = 40


@dataclass
class Outcomes:
    completed: list[tuple[str, str, int]] = field(default_factory=list)  # (tenant, id, tokens)
    failed: list[tuple[str, str, bool, str]] = field(default_factory=list)  # (tenant, id, streamed, error)


async def streaming_client(client: Any, tenant: str, stop: asyncio.Event, out: Outcomes) -> None:
    """Closed loop of streaming requests (``client``: an ``openai.AsyncOpenAI``); records how each
    ended and whether text had arrived."""
    while not stop.is_set():
        rid, tokens, streamed = "", 0, False
        try:
            stream = await client.completions.create(
                model="fairgate-sim",
                prompt=PROMPT,
                max_tokens=MAX_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            async for chunk in stream:
                rid = chunk.id
                streamed = streamed or bool(chunk.choices and chunk.choices[0].text)
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            out.completed.append((tenant, rid, tokens))
        except Exception as exc:
            out.failed.append((tenant, rid, streamed, repr(exc)))
