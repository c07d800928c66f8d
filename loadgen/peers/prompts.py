"""Prompt text for a replayed request, so that what shares a prefix in the workload shares it in text.

Every arm sees the same text, and engines, routers and fairgate's index all find prefixes in the text
itself. A request's known prefix blocks (the workload's hashed block ids) become ``block_tokens`` words
each, drawn from the block's id; the rest of the prompt is words of the request's own. ``nonce`` makes
one pass's text unlike another's, so no engine finds a cached prefix left by the arm measured before.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable

from fairgate.loadgen.workload import TraceRequest
from fairgate.workers.engines.simulated.tokenizer import VOCABULARY


def words(seed: int, n: int) -> str:
    """``n`` words (one simulated token each) drawn from ``seed``."""
    return " ".join(random.Random(seed).choices(VOCABULARY, k=n))


def prompt_builder(nonce: int, block_tokens: int) -> Callable[[TraceRequest], str]:
    """Text for each request: its prefix blocks, then words of its own; ``prompt_tokens`` words in all."""
    counter = iter(range(1 << 62))

    def text(r: TraceRequest) -> str:
        blocks = r.prefix[: r.prompt_tokens // block_tokens] if block_tokens else ()
        parts = [words(_seed(nonce, h), block_tokens) for h in blocks]
        rest = r.prompt_tokens - len(blocks) * block_tokens
        if rest:
            parts.append(words(_seed(nonce, -1 - next(counter)), rest))
        return " ".join(parts)

    return text


def _seed(nonce: int, key: int) -> int:
    return zlib.crc32(f"{nonce}:{key}".encode())
