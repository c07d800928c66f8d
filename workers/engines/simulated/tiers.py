"""KV cache tiers below an engine's GPU pool: host memory beside each engine, and a store shared by all.

vLLM offloads KV blocks to the host's memory (``--kv-offloading-size``); LMCache's server and
Mooncake's store keep them in DRAM shared by every engine. Both write through: a block is stored
there once its prefill has computed it, and stays until that tier's own LRU evicts it, whatever the
GPU pool does. A request whose leading blocks the GPU pool no longer holds but a tier does loads
them instead of recomputing them: the engine's step waits for the copy (``load_seconds``), far
shorter than the prefill it saves on long prompts.

Figures (``host_tier``, ``shared_tier``) are for Llama-3-8B's KV (128 KiB per token: 32 layers x 8 KV
heads x 128 x 2 (K, V) x 2 bytes) on an H200 node:

- host: 128 GiB per engine (an 8-GPU H200 node such as the DGX H200 has 2 TiB of DRAM, 256 GiB per
  GPU; half of it pinned for KV), over PCIe Gen5 x16: 64 GB/s per direction on paper, about 50 GB/s
  measured for pinned host-to-device copies (CUDA's bandwidthTest on Gen5 hosts), 1 ms per load;
- shared: 512 GiB of pooled DRAM reached over one 400 Gb/s RDMA NIC per GPU (about 40 GB/s usable),
  5 ms per load (a lookup in the store's index and the transfer's setup).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

LLAMA3_8B_KV_BYTES_PER_TOKEN = 131_072
GIB = 1 << 30

MEDIUM_GPU = "GPU"  # vLLM's names for where an event's blocks are
MEDIUM_HOST = "CPU"
MEDIUM_SHARED = "SHARED"


@dataclass(frozen=True, slots=True)
class TierSettings:
    """One tier: how many tokens of KV it holds and what loading them back costs."""

    medium: str
    tokens: int
    bandwidth_bytes_s: float
    latency_s: float
    kv_bytes_per_token: int = LLAMA3_8B_KV_BYTES_PER_TOKEN

    def __post_init__(self) -> None:
        if self.tokens <= 0 or self.bandwidth_bytes_s <= 0 or self.latency_s < 0:
            raise ValueError("a tier needs a positive size and bandwidth and a latency of at least 0")

    def load_seconds(self, tokens: int) -> float:
        return self.latency_s + tokens * self.kv_bytes_per_token / self.bandwidth_bytes_s if tokens else 0.0


def host_tier(gib: float = 128.0) -> TierSettings:
    """Host memory beside one H200 engine over PCIe Gen5 (module docstring)."""
    return TierSettings(MEDIUM_HOST, int(gib * GIB) // LLAMA3_8B_KV_BYTES_PER_TOKEN, 50e9, 0.001)


def shared_tier(gib: float = 512.0) -> TierSettings:
    """A store shared by every engine over RDMA (module docstring)."""
    return TierSettings(MEDIUM_SHARED, int(gib * GIB) // LLAMA3_8B_KV_BYTES_PER_TOKEN, 40e9, 0.005)


class BlockTier:
    """One tier's blocks (hash -> tokens), least recently used first; it reports what it stores and
    evicts as events (``take_events``) when asked to."""

    __slots__ = ("_blocks", "_events", "emits", "settings", "tokens")

    def __init__(self, settings: TierSettings, emits: bool = False) -> None:
        self.settings = settings
        self.emits = emits
        self._blocks: OrderedDict[int, int] = OrderedDict()
        self.tokens = 0
        self._events: list[tuple[str, str, tuple[int, ...]]] = []

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def leading(self, prefix: Sequence[int], start: int) -> int:
        """How many blocks of ``prefix`` from ``start`` on this tier holds, without a gap."""
        blocks, n = self._blocks, 0
        for h in prefix[start:]:
            if h not in blocks:
                break
            n += 1
        return n

    def store(self, prefix: Sequence[int], block_tokens: int) -> None:
        """``prefix``'s blocks were computed or used: held here, most recently used. Touched last
        block first, so that eviction takes a chain from its end, as an engine's pool does."""
        blocks, new = self._blocks, []
        for h in reversed(prefix):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = block_tokens
                self.tokens += block_tokens
                new.append(h)
        gone = []
        while self.tokens > self.settings.tokens and blocks:
            h, tokens = blocks.popitem(last=False)
            self.tokens -= tokens
            gone.append(h)
        if self.emits:
            if new:
                self._events.append(("stored", self.settings.medium, tuple(reversed(new))))
            if gone:
                self._events.append(("removed", self.settings.medium, tuple(gone)))

    def take_events(self) -> list[tuple[str, str, tuple[int, ...]]]:
        events, self._events = self._events, []
        return events
