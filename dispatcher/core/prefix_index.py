"""Which prompt blocks each worker probably holds in its prefix cache: a model, kept honest by the engine.

The dispatcher never sees text: a request carries the chained hashes of its prompt's full blocks
(``Request.prefix``, each covering ``Request.block_tokens`` tokens, salted per tenant by the ingress),
so equal hashes mean equal prefixes. Per worker the index is an LRU of those hashes, fed by what is
dispatched there (a block a request brings is cached once it has run its prefill) and bounded by the
worker's KV pool: an engine cannot cache more than it holds, so memory is bounded too.

The engine evicts earlier than a pool-sized LRU would (running requests hold blocks too). Each
request's exact cached count at start says how good the model was: a shortfall shrinks that worker's
modelled capacity (the oldest entries go), a full hit lets it grow back towards the pool. So an
expectation that was too hopeful once is corrected for the next requests, and every charge made from
it is corrected by the exact count anyway (docs/architecture.md: cost).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

SHRINK = 0.9  # capacity factor after a start that found less cached than expected
GROW = 1.02  # after one that found all it was expected to
MIN_CAPACITY = 0.05  # never model less than this fraction of the pool


class WorkerCache:
    """One worker's modelled cache: hash -> tokens it covers, least recently used first."""

    __slots__ = ("blocks", "capacity", "pool_tokens", "tokens", "version")

    def __init__(self, pool_tokens: int) -> None:
        self.pool_tokens = pool_tokens
        self.capacity = float(pool_tokens)
        self.blocks: OrderedDict[int, int] = OrderedDict()
        self.tokens = 0
        self.version = 0  # bumped by every change of what is held

    def matched(self, prefix: Sequence[int]) -> int:
        """How many leading blocks of ``prefix`` are held: a binary search, as what is held of a
        chain is always a leading part of it (``touch``)."""
        blocks = self.blocks
        if not prefix or prefix[0] not in blocks:
            return 0
        lo, hi = 1, len(prefix)  # prefix[:lo] held; is prefix[:hi] ?
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if prefix[mid - 1] in blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def touch(self, prefix: Sequence[int], block_tokens: int) -> None:
        """``prefix``'s blocks are (or are about to be) in the cache, most recently used. Touched
        last block first, so that a block is always more recent than the ones after it in any
        chain: eviction takes a chain from its end, and what stays is a leading part."""
        self.version += 1
        blocks = self.blocks
        for h in reversed(prefix):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = block_tokens
                self.tokens += block_tokens
        self._evict()

    def _evict(self) -> None:
        self.version += 1
        blocks = self.blocks
        while self.tokens > self.capacity and blocks:
            _, tokens = blocks.popitem(last=False)
            self.tokens -= tokens


class PrefixIndex:
    """The modelled caches of all workers of one pool."""

    __slots__ = ("_last", "_workers", "used")

    def __init__(self) -> None:
        self._workers: dict[str, WorkerCache] = {}
        # worker -> (its cache's state, prefix, answer) of the last question: a decision asks the
        # same one several times (placement, then the charge), and the answer holds until a change
        self._last: dict[str, tuple[int, Sequence[int], int]] = {}
        self.used = False  # anything was ever recorded (until then, nothing can be expected anywhere)

    def join(self, worker_id: str, pool_tokens: int) -> None:
        self._last.pop(worker_id, None)
        cache = self._workers.get(worker_id)
        if cache is None:
            self._workers[worker_id] = WorkerCache(pool_tokens)
        else:
            cache.pool_tokens = pool_tokens
            cache.capacity = min(cache.capacity, float(pool_tokens))
            cache._evict()

    def leave(self, worker_id: str) -> None:
        self._workers.pop(worker_id, None)
        self._last.pop(worker_id, None)

    def expected_tokens(self, worker_id: str, prefix: Sequence[int], block_tokens: int) -> int:
        """Prompt tokens a request with ``prefix`` should find cached on ``worker_id``."""
        cache = self._workers.get(worker_id)
        if cache is None or not prefix:
            return 0
        last = self._last.get(worker_id)
        if last is not None and last[1] is prefix and last[0] == cache.version:
            return last[2] * block_tokens
        n = cache.matched(prefix)
        self._last[worker_id] = (cache.version, prefix, n)
        return n * block_tokens

    def dispatched(self, worker_id: str, prefix: Sequence[int], block_tokens: int) -> None:
        """A request with ``prefix`` was sent to ``worker_id``: its blocks will be cached there."""
        cache = self._workers.get(worker_id)
        if cache is not None and prefix:
            cache.touch(prefix, block_tokens)
            self.used = True

    def observed(self, worker_id: str, expected: int, exact: int) -> None:
        """A request started on ``worker_id`` with ``exact`` cached tokens where ``expected`` were
        modelled: adapt that worker's modelled capacity."""
        cache = self._workers.get(worker_id)
        if cache is None or expected <= 0:
            return
        if exact < expected:
            cache.capacity = max(MIN_CAPACITY * cache.pool_tokens, cache.capacity * SHRINK)
            cache._evict()
        else:
            cache.capacity = min(float(cache.pool_tokens), cache.capacity * GROW)

    def stats(self) -> dict[str, dict[str, float]]:
        return {
            wid: {"blocks": len(c.blocks), "tokens": c.tokens, "capacity": c.capacity}
            for wid, c in self._workers.items()
        }

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, Any]:
        return {
            wid: {"pool_tokens": c.pool_tokens, "capacity": c.capacity, "blocks": list(c.blocks.items())}
            for wid, c in self._workers.items()
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        self._workers, self._last = {}, {}
        for wid, row in data.items():
            cache = WorkerCache(int(row["pool_tokens"]))
            cache.capacity = float(row["capacity"])
            cache.blocks = OrderedDict((int(h), int(t)) for h, t in row["blocks"])
            cache.tokens = sum(cache.blocks.values())
            self._workers[wid] = cache
            self.used = self.used or bool(cache.blocks)
