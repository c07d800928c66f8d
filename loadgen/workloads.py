"""The paper's named workloads as request lists, and the generator they are made with.

Presets follow the paper's artifact (``fair_bench/exp_suite.py``, ``trace.py``); every generator is
seeded and deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fairgate.loadgen.trace import load_trace_csv, synthesize_arena_trace
from fairgate.loadgen.workload import TraceRequest, Workload, WorkloadError


@dataclass(frozen=True)
class Phase:
    """A stretch of time in which a tenant sends at ``rate`` req/s (ramping to ``rate_end``).

    ``arrival``: "uniform" (fixed spacing, the paper's default) or "poisson". ``on_off_s``: send only
    in the even periods of this length (the paper's on/off pattern).
    """

    start_s: float
    end_s: float
    rate: float
    rate_end: float | None = None
    arrival: str = "uniform"
    on_off_s: float | None = None


@dataclass(frozen=True)
class TenantSpec:
    name: str
    phases: tuple[Phase, ...]
    prompt: tuple[int, int] = (256, 256)
    output: tuple[int, int] = (256, 256)
    weight: float = 1.0
    parent: str = ""  # its tree node ("": the root)
    klass: str = ""  # the request class of its requests ("": the default)


def generate(name: str, duration_s: float, specs: list[TenantSpec], seed: int, rate_scale: float = 1.0) -> Workload:
    """Turn tenant specs into a request list (numpy's generator, seeded: same seed, same list).
    ``rate_scale`` multiplies every rate (e.g. to overload several replicas)."""
    rng = np.random.default_rng(seed)
    requests: list[TraceRequest] = []
    for spec in specs:
        for phase in spec.phases:
            for t in _arrivals(phase, rng, rate_scale):
                p = int(rng.integers(spec.prompt[0], spec.prompt[1] + 1))
                o = int(rng.integers(spec.output[0], spec.output[1] + 1))
                requests.append(TraceRequest(spec.name, float(t), p, o, klass=spec.klass))
    requests.sort(key=lambda r: (r.arrival_s, r.tenant, r.klass))
    parents = {s.name: s.parent for s in specs if s.parent}
    return Workload(name, duration_s, requests, {s.name: s.weight for s in specs}, parents=parents)


def _arrivals(phase: Phase, rng: np.random.Generator, scale: float) -> list[float]:
    if phase.rate <= 0 or phase.end_s <= phase.start_s:
        return []
    length = phase.end_s - phase.start_s
    start_rate = phase.rate * scale
    end_rate = start_rate if phase.rate_end is None else phase.rate_end * scale

    def rate_at(t: float) -> float:
        return start_rate + (end_rate - start_rate) * (t - phase.start_s) / length

    out: list[float] = []
    if phase.arrival == "poisson":
        t = phase.start_s + rng.exponential(1.0 / rate_at(phase.start_s))
    else:
        t = phase.start_s + rng.random() / rate_at(phase.start_s)
    while t < phase.end_s:
        if phase.on_off_s is None or int(t // phase.on_off_s) % 2 == 0:
            out.append(t)
        gap = 1.0 / max(rate_at(t), 1e-9)
        t += rng.exponential(gap) if phase.arrival == "poisson" else gap
    return out


def _steady(name: str, rate: float, duration: float, length: int = 256, **kw: Any) -> TenantSpec:
    on_off = kw.pop("on_off_s", None)
    arrival = kw.pop("arrival", "uniform")
    return TenantSpec(
        name,
        (Phase(0.0, duration, rate, arrival=arrival, on_off_s=on_off),),
        (length, length),
        (length, length),
        **kw,
    )


def overload(seed: int, scale: float = 1.0) -> Workload:
    """Two tenants, 256/256, 1.5 and 3 req/s: both far above half the engine's capacity."""
    d = 600.0
    return generate("overload", d, [_steady("A", 1.5, d), _steady("B", 3.0, d)], seed, scale)


def proportional(seed: int, scale: float = 1.0) -> Workload:
    """Three tenants at 0.25, 0.5 and 1.5 req/s: the light ones get all they ask for."""
    d = 600.0
    specs = [_steady("A", 0.25, d), _steady("B", 0.5, d), _steady("C", 1.5, d)]
    return generate("proportional", d, specs, seed, scale)


def on_off_less(seed: int, scale: float = 1.0) -> Workload:
    """A (0.5 req/s) switches on and off every 60 s, under its share; B sends 2 req/s."""
    d = 600.0
    return generate("on_off_less", d, [_steady("A", 0.5, d, on_off_s=60.0), _steady("B", 2.0, d)], seed, scale)


def on_off_overload(seed: int, scale: float = 1.0) -> Workload:
    """A (2 req/s) switches on and off every 60 s and overloads when on; B sends 3 req/s."""
    d = 600.0
    return generate("on_off_overload", d, [_steady("A", 2.0, d, on_off_s=60.0), _steady("B", 3.0, d)], seed, scale)


def poisson_short_long(seed: int, scale: float = 1.0) -> Workload:
    """Poisson arrivals: A sends many short requests (64/64, 8 req/s), B long ones (256/256, 1.5)."""
    return _poisson_pair("poisson_short_long", (64, 64), (256, 256), seed, scale)


def poisson_short_long_2(seed: int, scale: float = 1.0) -> Workload:
    """Poisson arrivals: A sends long prompts with short outputs (512/32, 8 req/s), B the reverse."""
    return _poisson_pair("poisson_short_long_2", (512, 32), (32, 512), seed, scale)


def _poisson_pair(name: str, a: tuple[int, int], b: tuple[int, int], seed: int, scale: float) -> Workload:
    """A at 8 req/s and B at 1.5 req/s, Poisson, for 600 s; each with fixed (prompt, output) lengths."""
    d = 600.0
    specs = [
        TenantSpec(tenant, (Phase(0, d, rate, arrival="poisson"),), (prompt, prompt), (output, output))
        for tenant, rate, (prompt, output) in (("A", 8.0, a), ("B", 1.5, b))
    ]
    return generate(name, d, specs, seed, scale)


def increase(seed: int, scale: float = 1.0) -> Workload:
    """A sends 0.5 req/s; B ramps linearly from 0.2 to 2 req/s."""
    d = 600.0
    specs = [
        _steady("A", 0.5, d),
        TenantSpec("B", (Phase(0, d, 0.2, rate_end=2.0),)),
    ]
    return generate("increase", d, specs, seed, scale)


def dist_shift(seed: int, scale: float = 1.0, idle_s: float = 60.0) -> Workload:
    """Three 300 s phases: A on/off (``idle_s``) vs B at 2 req/s; both at 1 req/s; A 0.5 vs B 1.5.

    LCF lets A bank credit while off and then starve B; VTC's lift does not.
    """
    d = 900.0
    third = d / 3
    specs = [
        TenantSpec(
            "A",
            (
                Phase(0, third, 0.5, on_off_s=idle_s),
                Phase(third, 2 * third, 1.0),
                Phase(2 * third, d, 0.5),
            ),
        ),
        TenantSpec("B", (Phase(0, third, 2.0), Phase(third, 2 * third, 1.0), Phase(2 * third, d, 1.5))),
    ]
    return generate("dist_shift", d, specs, seed, scale)


def overload_multi(seed: int, scale: float = 1.0) -> Workload:
    """Eight tenants, 0.4 req/s × 3 and 0.6 req/s × 5, 256/256: everyone backlogged."""
    d = 360.0
    rates = [0.4, 0.4, 0.4, 0.6, 0.6, 0.6, 0.6, 0.6]
    return generate("overload_multi", d, [_steady(f"T{i}", r, d) for i, r in enumerate(rates)], seed, scale)


def overload_weighted(seed: int, scale: float = 1.0) -> Workload:
    """Four tenants of weights 1, 2, 3 and 4, each sending 1 req/s of 256/256: service should be 1:2:3:4."""
    d = 600.0
    specs = [_steady(f"W{w}", 1.0, d, weight=float(w)) for w in (1, 2, 3, 4)]
    return generate("overload_weighted", d, specs, seed, scale)


def ablation(seed: int, scale: float = 1.0) -> list[Workload]:
    """Two tenants at a 1:2 rate, both overloaded, for KV pools of 35,000 and 65,000 tokens and request
    lengths of 256, 512 and 768 (in and out)."""
    d = 300.0
    out = []
    base_rates = {256: 3.0, 512: 1.5, 768: 1.0}  # the artifact's rates for a 35,000-token pool
    for kv in (35_000, 65_000):
        for length, rate in base_rates.items():
            scale = kv / 35_000
            specs = [_steady("A", rate * scale, d, length), _steady("B", 2 * rate * scale, d, length)]
            w = generate(f"ablation-{kv}-{length}", d, specs, seed, scale)
            w.kv_tokens = kv
            out.append(w)
    return out


def real(seed: int, trace: str | Path | None = None) -> Workload:
    """The real trace (27 clients, 600 s) from a CSV file, or one synthesised with its statistics."""
    if trace is not None:
        return trace_workload(trace)
    requests, duration = synthesize_arena_trace(seed)
    return Workload("real", duration, [TraceRequest(*r) for r in requests])


PRESETS: dict[str, Callable[..., Workload | list[Workload]]] = {
    "overload": overload,
    "proportional": proportional,
    "on_off_less": on_off_less,
    "on_off_overload": on_off_overload,
    "poisson_short_long": poisson_short_long,
    "poisson_short_long_2": poisson_short_long_2,
    "increase": increase,
    "dist_shift": dist_shift,
    "overload_multi": overload_multi,
    "overload_weighted": overload_weighted,
    "ablation": ablation,
    "real": real,
}


def trace_workload(path: str | Path) -> Workload:
    """A trace CSV (tenant, arrival, prompt and output length per row) as a workload."""
    try:
        requests, duration = load_trace_csv(path)
    except ValueError as exc:
        raise WorkloadError(str(exc)) from None
    return Workload(Path(path).stem, duration, [TraceRequest(*r) for r in requests])
