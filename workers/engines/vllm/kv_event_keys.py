"""vLLM's KV cache events in the dispatcher's terms: which of its prompt-block hashes a block is.

vLLM publishes what its KV cache stores and evicts (``--kv-events-config``): stored blocks carry vLLM's
own block hashes, their parent's hash, their token ids, the LoRA adapter and, on a prompt's first block,
the request's cache salt; removed blocks carry only their hashes. The dispatcher keys blocks its own
way (``fairgate.common.prefix_hashes``): chained hashes over the served model's name and the prompt's tokens at
a coarser stride (``hash_block_tokens``), salted by the tenant's cache group and its adapter. So this
follows each of vLLM's chains from its root, hashing the tokens as the ingress does; a vLLM block that
ends a stride is the dispatcher's key for the prompt up to there.

The cache salt names the group: the worker gave vLLM ``tenant_cache_salt(group)`` and tells this which
group each salt is (``learn_salt``). A block whose chain began before this was listening, or under a salt
it was not told, has no key: it is left out (``unknown``), and the dispatcher's index simply does not
expect it.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable
from typing import Any

from fairgate.common.prefix_hashes import for_adapter, hash_block_tokens, salted
from fairgate.workers.engines.interface import KVEvent

GPU = "GPU"
MAX_SALTS = 100_000


class _Chain:
    """One cached vLLM block: the chain's running hash up to its end, and where it is held."""

    __slots__ = ("adapter", "depth", "group", "hasher", "key", "media")

    def __init__(self, hasher: Any, depth: int, group: str | None, adapter: str, key: int | None) -> None:
        self.hasher = hasher
        self.depth = depth
        self.group = group
        self.adapter = adapter
        self.key = key
        self.media: set[str] = set()


class KvEventKeys:
    """Turns vLLM's events (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``) into ``KVEvent``s."""

    def __init__(self, model: str, block_size: int) -> None:
        self.model = model
        self.stride = hash_block_tokens(block_size)
        self._chains: dict[Any, _Chain] = {}
        self._groups: dict[str, str] = {}  # cache salt -> the group it is the salt of
        self.unknown = 0  # stored blocks left out: their chain's start or its salt was not known

    def learn_salt(self, salt: str, group: str) -> None:
        if salt and salt not in self._groups:
            if len(self._groups) >= MAX_SALTS:
                self._groups.clear()
            self._groups[salt] = group

    def translate(self, event: Any) -> list[KVEvent]:
        kind = type(event).__name__
        if kind == "BlockStored":
            return self._stored(event)
        if kind == "BlockRemoved":
            return self._removed(event.block_hashes, event.medium or GPU)
        if kind == "AllBlocksCleared":
            for h in [h for h, c in self._chains.items() if GPU in c.media]:
                self._drop(h, GPU)
            return [("cleared", GPU, ())]
        return []

    @property
    def blocks(self) -> int:
        return len(self._chains)

    def _stored(self, event: Any) -> list[KVEvent]:
        medium = event.medium or GPU
        size = int(event.block_size)
        tokens = event.token_ids
        prev = None if event.parent_block_hash is None else self._chains.get(event.parent_block_hash)
        if event.parent_block_hash is None:  # a chain's first block: hashed from the model's name, as the ingress does
            root = hashlib.blake2b(self.model.encode(), digest_size=8)
            prev = _Chain(root, 0, self._group(event), event.lora_name or "", None)
        keys: list[int] = []
        for i, h in enumerate(event.block_hashes):
            known = self._chains.get(h)
            if known is None:
                if prev is None:  # its chain is not known here
                    self.unknown += 1
                    continue
                hasher = prev.hasher.copy()
                hasher.update(array("q", tokens[i * size : (i + 1) * size]).tobytes())
                depth = prev.depth + size
                key = None
                if depth % self.stride == 0 and prev.group is not None:
                    raw = int.from_bytes(hasher.digest(), "big") >> 1
                    key = salted(for_adapter((raw,), prev.adapter), prev.group)[0]
                known = self._chains[h] = _Chain(hasher, depth, prev.group, prev.adapter, key)
            known.media.add(medium)
            if known.key is not None:
                keys.append(known.key)
            prev = known
        return [("stored", medium, tuple(keys))] if keys else []

    def _group(self, event: Any) -> str | None:
        """The group whose cache salt the chain's first block carries (None: no salt this knows)."""
        extra = (event.extra_keys or [None])[0] or ()
        for value in extra:
            if isinstance(value, str) and value in self._groups:
                return self._groups[value]
        return None

    def _removed(self, hashes: Iterable[Any], medium: str) -> list[KVEvent]:
        keys = [key for h in hashes if (key := self._drop(h, medium)) is not None]
        return [("removed", medium, tuple(keys))] if keys else []

    def _drop(self, h: Any, medium: str) -> int | None:
        chain = self._chains.get(h)
        if chain is None or medium not in chain.media:
            return None
        chain.media.discard(medium)
        if not chain.media:
            del self._chains[h]
        return chain.key
