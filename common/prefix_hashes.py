"""Chained hashes of a prompt's token blocks: what the dispatcher knows of a prompt (docs/architecture.md).

Block i's hash covers the salt and every token up to the end of block i, so equal hashes mean equal
prefixes (and the same salt: a tenant's, or its sharing group's; tenants are never compared across
salts). Only full blocks are hashed: an engine caches whole blocks. The ingress hashes at a coarser
stride than the engine's KV block (``hash_block_tokens``: a whole number of KV blocks, at least
``MIN_HASH_TOKENS``) so that a long prompt stays a few dozen hashes on the wire and in the index; the
expectation it gives is low by less than one stride, and the engine's exact count corrects it.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

MIN_HASH_TOKENS = 256


def hash_block_tokens(engine_block: int) -> int:
    """Tokens per hash: the smallest whole number of KV blocks of at least ``MIN_HASH_TOKENS``."""
    engine_block = max(1, engine_block)
    return engine_block * -(-MIN_HASH_TOKENS // engine_block)


def salted(prefix: Sequence[int], group: str) -> tuple[int, ...]:
    """``prefix`` (hashed by the ingress, unsalted) as it is cached for ``group``: tenants of different
    groups never share a cached block, however equal their prompts (the engine salts them apart too)."""
    salt = int.from_bytes(hashlib.blake2b(group.encode(), digest_size=8).digest(), "big") >> 1
    return tuple(h ^ salt for h in prefix)


def for_adapter(prefix: Sequence[int], adapter: str) -> tuple[int, ...]:
    """``prefix`` as cached under a LoRA adapter ("": the base model, unchanged): an engine keys its
    cached blocks by adapter, so a prefix under one adapter is no hit under another."""
    return salted(prefix, f"adapter:{adapter}") if adapter else tuple(prefix)


def block_hashes(tokens: Sequence[int], block_tokens: int, salt: str) -> tuple[int, ...]:
    """The chained 63-bit hashes of ``tokens``' full blocks of ``block_tokens``."""
    out: list[int] = []
    chain = hashlib.blake2b(salt.encode(), digest_size=8)
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        chain.update(array("q", tokens[start : start + block_tokens]).tobytes())
        out.append(int.from_bytes(chain.copy().digest(), "big") >> 1)
    return tuple(out)
