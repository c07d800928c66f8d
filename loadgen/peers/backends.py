"""The engines the peers route to: ``engines`` engines, each served alone as users run it without
fairgate (``EnginePlugin.reference_server``: the simulated engine's own OpenAI layer, the layer
fairgate's workers run, or vLLM's own server), started once and shared by every peer. Between passes
the bench waits until none of them runs or queues anything, so that no pass inherits another's work."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fairgate.loadgen.pausing import listening_process
from fairgate.loadgen.serve_process import free_port
from fairgate.workers.engines import engine_for

GAUGE = re.compile(r"^vllm:num_requests_(?:running|waiting)\{[^}]*\} (\d+(?:\.\d+)?)$", re.M)


@dataclass(frozen=True)
class Backends:
    roots: tuple[str, ...]  # each engine's server, without ``/v1``
    pids: tuple[int, ...]

    def busy(self) -> int:
        """Requests running or waiting in all the engines."""
        total = 0
        for root in self.roots:
            text = httpx.get(root + "/metrics", timeout=10).text
            total += sum(int(float(v)) for v in GAUGE.findall(text))
        return total

    def wait_idle(self, timeout_s: float = 120.0) -> float:
        """Until every engine is idle; the seconds it took."""
        t0 = time.monotonic()
        while self.busy():
            if time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"the engines still had work {timeout_s:.0f} s after the pass")
            time.sleep(0.2)
        return time.monotonic() - t0


@contextlib.contextmanager
def shared_backends(
    engine: str, engines: int, settings: dict[str, Any], model: str, log_dir: Path | None = None
) -> Iterator[Backends]:
    plugin = engine_for(engine)
    with contextlib.ExitStack() as stack:
        roots: list[str] = []
        pids: list[int] = []
        for i in range(engines):
            port = free_port()
            log = log_dir / f"engine-{i}.log" if log_dir is not None else None
            served = plugin.reference_server(plugin.settings(settings), model, port, log)
            roots.append(stack.enter_context(served).removesuffix("/v1"))
            pid = listening_process(port)
            if pid is None:
                raise RuntimeError(f"no process listens on engine {i}'s port {port}")
            pids.append(pid)
        yield Backends(tuple(roots), tuple(pids))
