"""LoRA adapters in the engine model: slots on the GPU and in host memory, and what a load costs
(docs/simulation.md, "Adapters").

As vLLM serves them: a batch holds at most ``max_loras`` distinct adapters (its scheduler skips a
waiting request whose adapter would be one too many and looks at the next), the GPU keeps
``max_loras`` adapters loaded and host memory ``max_cpu_loras``, each evicting the least recently used
one the batch does not need. A step whose batch needs an adapter not on the GPU first copies it there
from host memory, loading it from disk into host memory first if it is not there either; the whole
batch waits for the copies (the step is longer by them).

The default figures, for Llama-2-7B with rank-16 adapters on the attention projections (q, k, v, o:
4096 x 4096 each, 32 layers): an adapter is 2 bytes x 16 x (4096 + 4096) x 4 x 32 = 33.6 MB. Host to
GPU at 25 GB/s: PCIe Gen4 x16 carries 31.5 GB/s each way (PCI-SIG; the A10G and A100 PCIe attach by
it), of which pinned copies reach about 80%. Disk to host at 2 GB/s (a data-center NVMe SSD's
sequential read, as the local disks of AWS g5 hosts) and 10 ms to open the file and read its header.
So a host hit costs 1.3 ms, a miss 27 ms.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


def adapter_bytes(rank: int, shapes: Iterable[tuple[int, int]], layers: int, bytes_per_weight: int = 2) -> int:
    """The size of a LoRA adapter: A (rank x d_in) and B (d_out x rank) for each target module shape
    (d_in, d_out) of each layer."""
    return bytes_per_weight * rank * sum(d_in + d_out for d_in, d_out in shapes) * layers


LLAMA2_7B_RANK16 = adapter_bytes(16, [(4096, 4096)] * 4, 32)


@dataclass(frozen=True, slots=True)
class AdapterSettings:
    """An engine's adapter slots (vLLM's ``--max-loras``, ``--max-cpu-loras``) and load figures."""

    max_loras: int = 4
    max_cpu_loras: int = 16
    bytes: int = LLAMA2_7B_RANK16
    host_to_gpu_gb_s: float = 25.0
    disk_to_host_gb_s: float = 2.0
    disk_open_s: float = 0.010

    def __post_init__(self) -> None:
        if self.max_loras < 1 or self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"adapters: max_loras must be at least 1 and max_cpu_loras at least max_loras, "
                f"got {self.max_loras} and {self.max_cpu_loras}"
            )

    @property
    def host_to_gpu_s(self) -> float:
        return self.bytes / (self.host_to_gpu_gb_s * 1e9)

    @property
    def disk_to_host_s(self) -> float:
        return self.disk_open_s + self.bytes / (self.disk_to_host_gb_s * 1e9)


class AdapterCache:
    """Which adapters are on the GPU and in host memory (least recently used first), and the loads."""

    def __init__(self, settings: AdapterSettings) -> None:
        self.settings = settings
        self.gpu: OrderedDict[str, None] = OrderedDict()
        self.host: OrderedDict[str, None] = OrderedDict()
        self.gpu_loads = 0  # host to GPU copies
        self.disk_loads = 0  # disk to host loads
        self.load_s = 0.0  # time steps spent on loads, in all
        self.step_loads: dict[str, float] = {}  # adapter -> seconds its loads took in the last step

    def fits(self, batch: Iterable[str], adapter: str) -> bool:
        """Whether a request for ``adapter`` ("": the base model) may join a batch holding ``batch``."""
        if not adapter:
            return True
        held = set(batch)
        return adapter in held or len(held) < self.settings.max_loras

    def activate(self, batch: Iterable[str]) -> float:
        """Put every adapter of a step's batch on the GPU; the time the loads take."""
        needed = {a for a in batch if a}
        spent = 0.0
        self.step_loads = {}
        for adapter in sorted(needed):
            if adapter in self.gpu:
                self.gpu.move_to_end(adapter)
                self.host.move_to_end(adapter)
                continue
            took = self.settings.host_to_gpu_s
            if adapter not in self.host:
                took += self.settings.disk_to_host_s
                self.disk_loads += 1
            self.host[adapter] = None
            self.host.move_to_end(adapter)
            spent += took
            self.step_loads[adapter] = took
            self.gpu_loads += 1
            self.gpu[adapter] = None
        _evict(self.gpu, self.settings.max_loras, needed)
        _evict(self.host, self.settings.max_cpu_loras, needed)
        self.load_s += spent
        return spent


def _evict(cache: OrderedDict[str, None], capacity: int, keep: set[str]) -> None:
    """Drop least recently used entries not in ``keep`` until ``cache`` holds ``capacity``."""
    for adapter in [a for a in cache if a not in keep][: max(0, len(cache) - capacity)]:
        del cache[adapter]
