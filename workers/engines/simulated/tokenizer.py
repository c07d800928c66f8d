"""The simulated engine's tokenizer: deterministic, dependency-free, and shared by the ingress (to count
prompt tokens) and the simulated worker (to count and to produce text), so both agree exactly.

A token is a run of word characters or a single other non-space character; text is produced from a
fixed vocabulary, one word per token, each preceded by a space.
"""

from __future__ import annotations

import hashlib
import re
import zlib

_TOKEN = re.compile(r"\w+|[^\w\s]")
VOCABULARY = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "been",
    "one",
    "all",
    "we",
    "their",
    "has",
    "would",
    "when",
    "if",
    "so",
    "no",
    "will",
    "can",
    "more",
)


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def token_ids(text: str) -> list[int]:
    """The tokens of ``text`` as ids (a stable 31-bit hash of each token's text), for prefix hashes."""
    return [zlib.crc32(t.encode()) >> 1 for t in _TOKEN.findall(text)]


def token_text(seed: int, index: int) -> str:
    """The ``index``-th generated token of a stream seeded by ``seed`` (always one token long)."""
    return " " + VOCABULARY[(seed * 1_000_003 + index * 7_919) % len(VOCABULARY)]


def natural_length(prompt: str, seed: int, mean: int = 200) -> int:
    """Where the simulated model would stop by itself: deterministic in (prompt, seed), 1..4·mean."""
    return 1 + stable_seed(f"{seed}\0{prompt}") % (4 * mean)


def stable_seed(text: str) -> int:
    """A seed derived from ``text`` that is the same in every process (unlike ``hash``)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")
