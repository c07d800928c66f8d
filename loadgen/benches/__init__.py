"""Benchmarks as plug-ins: one module per bench in this package, registered by name (``base.Bench``).

``fairgate bench NAME`` runs one, with its options as flags and ``--json`` for its figures; adding a
bench is adding one module here. Figures several benches share are computed in ``shared``.
"""

from __future__ import annotations

from fairgate.core.registry import discover
from fairgate.loadgen.benches.base import BENCHES, Bench

__all__ = ["Bench", "bench_for", "bench_names"]

discover(__name__, __path__)


def bench_names() -> list[str]:
    return BENCHES.names()


def bench_for(name: str) -> Bench:
    cls = BENCHES.get(name)
    if cls is None:
        raise ValueError(f"unknown bench {name!r} (expected one of: {', '.join(bench_names())})")
    return cls()
