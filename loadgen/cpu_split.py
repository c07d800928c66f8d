"""Splitting a machine's CPUs between an engine's compute and everything else, as a GPU host is split.

On a GPU host the model runs on the device and the host's cores run the API layers, the gateway and the
clients; on a CPU-only machine the engine's kernels share the same cores with all of them, so every
CPU-second a front spends comes out of the engine's steps. ``fairgate bench openai --engine-cpus`` pins
the engine's own processes (its step loop and the model's, found by their process titles, which the
engine plug-in names) to some cores and every other process of both arms to the rest, in both arms
alike, so that the comparison measures what a front costs the engine, not what it costs the cores the
engine computes on. How busy each side's cores were in each pass is measured too (``busy_share``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from fairgate.loadgen.pausing import PROC, process_tree

MACHINE_CPUS = frozenset(os.sched_getaffinity(0))  # before this process pins itself to the host's share


def parse_cpus(text: str) -> set[int]:
    """``"1"``, ``"2,3"``, ``"0-3"`` -> the set of CPU ids (each must be one this process may use)."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",") if p.strip()):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    if not cpus or not cpus < MACHINE_CPUS:
        raise ValueError(f"engine CPUs {sorted(cpus)} must be some, not all, of this machine's {sorted(MACHINE_CPUS)}")
    return cpus


def _title(pid: int) -> str:
    with contextlib.suppress(OSError):
        return (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    return ""


def _pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (a thread started later inherits its starter's CPUs)."""
    for task in Path(PROC / str(pid) / "task").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task.name), cpus)


def split_cpus(roots: Iterable[int], engine_titles: tuple[str, ...], engine_cpus: set[int]) -> tuple[int, int]:
    """Pins each process under ``roots`` (and this one): those whose title starts with one of
    ``engine_titles`` to ``engine_cpus``, the others to the remaining CPUs. Returns how many processes
    went each way (call again after a server started new processes)."""
    host_cpus = set(MACHINE_CPUS - engine_cpus)
    engine = host = 0
    pids = {os.getpid()}
    for root in roots:
        pids.update(process_tree(root))
    for pid in pids:
        if _title(pid).startswith(engine_titles):
            _pin_process(pid, engine_cpus)
            engine += 1
        else:
            _pin_process(pid, host_cpus)
            host += 1
    return engine, host


def cpu_times() -> dict[int, tuple[int, int]]:
    """Per CPU, (busy, total) clock ticks since boot (``/proc/stat``)."""
    out = {}
    for line in (PROC / "stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            ticks = [int(f) for f in fields]
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and iowait
            out[int(name[3:])] = (sum(ticks) - idle, sum(ticks))
    return out


def busy_share(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], cpus: Iterable[int]) -> float:
    """How busy ``cpus`` were between two ``cpu_times`` readings (0 to 1, their mean)."""
    busy = total = 0
    for c in cpus:
        if c in before and c in after:
            busy += after[c][0] - before[c][0]
            total += after[c][1] - before[c][1]
    return busy / total if total else 0.0
