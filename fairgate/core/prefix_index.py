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

A worker whose engine reports its KV cache events (blocks stored and removed, per medium, as vLLM
publishes them) is no longer modelled: its pool's entries are what the engine says it holds (plus what
was just dispatched there, until the engine says otherwise), and the index learns two tiers below it:
the blocks in that worker's host memory, and those in a store every worker of the pool shares. A
request then expects its leading blocks from the pool, the rest of the run from host memory, then from
the shared store (``expected_by_tier``); all of them skip prefill. Each start's exact count says how
often the index and the engine agree (``agreement``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

STORED, REMOVED, CLEARED = "stored", "removed", "cleared"
MEDIUM_GPU, MEDIUM_HOST, MEDIUM_SHARED = "GPU", "CPU", "SHARED"
NOTHING = (0, 0, 0)
SHRINK = 0.9  # capacity factor after a start that found less cached than expected
GROW = 1.02  # after one that found all it was expected to
MIN_CAPACITY = 0.05  # never model less than this fraction of the pool


class WorkerCache:
    """One worker's modelled cache: hash -> tokens it covers, least recently used first."""

    __slots__ = ("blocks", "capacity", "fed", "host", "pool_tokens", "tokens", "version")

    def __init__(self, pool_tokens: int) -> None:
        self.pool_tokens = pool_tokens
        self.capacity = float(pool_tokens)
        self.blocks: OrderedDict[int, int] = OrderedDict()
        self.tokens = 0
        self.version = 0  # bumped by every change of what is held
        self.fed = False  # its engine reports KV events: what it holds is known, not modelled
        self.host: set[int] = set()  # blocks in its host memory (known from events only)

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

    def drop(self, hashes: Sequence[int]) -> None:
        """The engine evicted these blocks."""
        self.version += 1
        blocks = self.blocks
        for h in hashes:
            tokens = blocks.pop(h, None)
            if tokens is not None:
                self.tokens -= tokens

    def clear(self) -> None:
        self.version += 1
        self.blocks.clear()
        self.tokens = 0


class PrefixIndex:
    """The modelled caches of all workers of one pool."""

    __slots__ = ("_last", "_shared", "_tiers_version", "_workers", "agreed", "block_tokens", "compared", "used")

    def __init__(self) -> None:
        self._workers: dict[str, WorkerCache] = {}
        self._shared: set[int] = set()  # blocks in the store all workers share (known from events only)
        self._tiers_version = 0  # bumped by every change of a host or shared tier
        self.block_tokens = 0  # tokens per hash (the pool's stride), learnt from what is dispatched
        self.compared = 0  # starts whose expectation met the engine's exact count, and those that agreed
        self.agreed = 0
        # worker -> (its caches' state, prefix, blocks found per tier) of the last question: a decision
        # asks the same one several times (placement, then the charge), and the answer holds until a change
        self._last: dict[str, tuple[int, Sequence[int], tuple[int, int, int]]] = {}
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
        """Prompt tokens a request with ``prefix`` should find cached on ``worker_id``, in any tier."""
        gpu, host, shared = self._found(worker_id, prefix)
        return (gpu + host + shared) * block_tokens

    def expected_by_tier(self, worker_id: str, prefix: Sequence[int], block_tokens: int) -> tuple[int, int, int]:
        """Prompt tokens ``prefix`` should find on ``worker_id``: in its pool, then (where the pool's
        run ends) in its host memory, then in the shared store."""
        gpu, host, shared = self._found(worker_id, prefix)
        return gpu * block_tokens, host * block_tokens, shared * block_tokens

    @property
    def tiered(self) -> bool:
        """Some tier below a pool has reported (until then every expectation is the pool's)."""
        return self._tiers_version > 0

    def _found(self, worker_id: str, prefix: Sequence[int]) -> tuple[int, int, int]:
        """Blocks of ``prefix`` found per tier on ``worker_id``, remembered until its caches change."""
        cache = self._workers.get(worker_id)
        if cache is None or not prefix:
            return NOTHING
        last = self._last.get(worker_id)
        version = cache.version + self._tiers_version
        if last is not None and last[1] is prefix and last[0] == version:
            return last[2]
        blocks = self._matched_by_tier(cache, prefix)
        self._last[worker_id] = (version, prefix, blocks)
        return blocks

    def _matched_by_tier(self, cache: WorkerCache, prefix: Sequence[int]) -> tuple[int, int, int]:
        gpu = cache.matched(prefix)
        host = shared = 0
        if cache.host:
            for h in prefix[gpu:]:
                if h not in cache.host:
                    break
                host += 1
        if self._shared:
            for h in prefix[gpu + host :]:
                if h not in self._shared:
                    break
                shared += 1
        return gpu, host, shared

    def dispatched(self, worker_id: str, prefix: Sequence[int], block_tokens: int) -> None:
        """A request with ``prefix`` was sent to ``worker_id``: its blocks will be cached there."""
        cache = self._workers.get(worker_id)
        if cache is not None and prefix:
            cache.touch(prefix, block_tokens)
            self.used = True
            self.block_tokens = block_tokens

    def apply_events(self, worker_id: str, events: Sequence[tuple[str, str, Sequence[int]]]) -> None:
        """What ``worker_id``'s engine stored and evicted (its KV cache events, in order): from now on
        its pool is known, not modelled, and its host memory and the shared store are known too."""
        cache = self._workers.get(worker_id)
        if cache is None or not events:
            return
        if not cache.fed:
            cache.fed = True
            cache.capacity = float(cache.pool_tokens)
        block = self.block_tokens or 1
        for kind, medium, hashes in events:
            if medium == MEDIUM_GPU:
                if kind == STORED:
                    cache.touch(hashes, block)
                elif kind == REMOVED:
                    cache.drop(hashes)
                elif kind == CLEARED:
                    cache.clear()
                continue
            held = cache.host if medium == MEDIUM_HOST else self._shared if medium == MEDIUM_SHARED else None
            if held is None:
                continue
            self._tiers_version += 1
            if kind == STORED:
                held.update(hashes)
            elif kind == REMOVED:
                held.difference_update(hashes)
            elif kind == CLEARED:
                held.clear()
        self.used = True

    def agreement(self) -> float | None:
        """The share of starts whose expected cached prefix matched the engine's exact count (within
        one hash's tokens: the index sees whole hashes, the engine whole KV blocks)."""
        return self.agreed / self.compared if self.compared else None

    def observed(self, worker_id: str, expected: int, exact: int, block_tokens: int = 0) -> None:
        """A request started on ``worker_id`` with ``exact`` cached tokens where ``expected`` were
        modelled: adapt that worker's modelled capacity (an event-fed one needs no adapting)."""
        cache = self._workers.get(worker_id)
        if cache is None:
            return
        self.compared += 1
        self.agreed += abs(exact - expected) < max(1, block_tokens)
        if expected <= 0 or cache.fed:
            return
        if exact < expected:
            cache.capacity = max(MIN_CAPACITY * cache.pool_tokens, cache.capacity * SHRINK)
            cache._evict()
        else:
            cache.capacity = min(float(cache.pool_tokens), cache.capacity * GROW)

    def stats(self) -> dict[str, dict[str, float]]:
        return {
            wid: {
                "blocks": len(c.blocks),
                "tokens": c.tokens,
                "capacity": c.capacity,
                "host_blocks": len(c.host),
                "fed": c.fed,
            }
            for wid, c in self._workers.items()
        }

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, Any]:
        return {
            wid: {
                "pool_tokens": c.pool_tokens,
                "capacity": c.capacity,
                "blocks": list(c.blocks.items()),
                "fed": c.fed,
                "host": sorted(c.host),
            }
            for wid, c in self._workers.items()
        } | {
            "": {
                "shared": sorted(self._shared),
                "block_tokens": self.block_tokens,
                "used": self.used,  # a cleared index that was used still lets the locality slack look
                "compared": self.compared,
                "agreed": self.agreed,
            }
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        self._workers, self._last, self._shared = {}, {}, set()
        for wid, row in data.items():
            if wid == "":  # the pool's own: the shared store, the stride (no worker is named "")
                self._shared = {int(h) for h in row["shared"]}
                self.block_tokens = int(row["block_tokens"])
                self.used = self.used or bool(row.get("used", False))
                self.compared, self.agreed = int(row.get("compared", 0)), int(row.get("agreed", 0))
                continue
            cache = WorkerCache(int(row["pool_tokens"]))
            cache.capacity = float(row["capacity"])
            cache.blocks = OrderedDict((int(h), int(t)) for h, t in row["blocks"])
            cache.tokens = sum(cache.blocks.values())
            cache.fed = bool(row.get("fed", False))
            cache.host = {int(h) for h in row.get("host", ())}
            self._workers[wid] = cache
            self.used = self.used or bool(cache.blocks) or bool(cache.host)
        self._tiers_version += 1
