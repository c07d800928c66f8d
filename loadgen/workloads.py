"""Workloads: the paper's named presets, custom YAML/JSON specs and real traces, as request lists.

A workload is a list of requests (tenant, arrival time, prompt and output length) plus tenant weights.
Presets follow the paper's artifact (``fair_bench/exp_suite.py``, ``trace.py``); every generator is
seeded and deterministic. The simulator and ``fairgate loadgen`` replay the same lists.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dispatcher.core.classes import RequestClass, check_classes, default_class, leaf_name
from loadgen.trace import load_trace_csv, synthesize_arena_trace


class WorkloadError(ValueError):
    """A workload name, file or spec that cannot be used; the message names the problem."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request: ``output_tokens`` is what it generates; ``max_tokens`` what it asks for (None:
    exactly what it generates, as in the paper's traces). ``prefix``: the chained hashes of its
    prompt's full blocks (the workload's ``prefix_block`` tokens each; empty when unknown), already
    salted per tenant, as the ingress salts them."""

    tenant: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int | None = None
    prefix: tuple[int, ...] = ()
    klass: str = ""  # its request class ("": the default)


@dataclass
class Workload:
    """Requests sorted by arrival. ``kv_tokens``: a pool size the workload asks for (ablations).
    ``tree``: tenant tree nodes (name, parent, weight), parents first; ``parents``: each tenant's node
    (absent: the root); ``classes``: the request classes its requests name (DESIGN §2b)."""

    name: str
    duration_s: float
    requests: list[TraceRequest]
    weights: dict[str, float] = field(default_factory=dict)
    kv_tokens: int | None = None
    prefix_block: int = 0  # tokens per prefix hash (0: the requests carry none)
    tree: list[tuple[str, str, float]] = field(default_factory=list)
    parents: dict[str, str] = field(default_factory=dict)
    classes: tuple[RequestClass, ...] = ()
    # closed-loop tenants: each of their requests, when it ends, is followed at once by a copy of it, so
    # that their first requests (all arriving at the start) stay outstanding until ``duration_s``
    outstanding: dict[str, int] = field(default_factory=dict)

    @property
    def tenants(self) -> list[str]:
        """The leaves that queue requests: tenants, and ``tenant~class`` for a non-default class."""
        default = default_class(self.classes)
        seen = dict.fromkeys(self.weights)
        for r in self.requests:
            seen.setdefault(leaf_name(r.tenant, r.klass, default))
        return list(seen)

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def longest(self) -> tuple[int, int]:
        """The longest prompt and the longest output among the requests (what 2U depends on)."""
        return (
            max((r.prompt_tokens for r in self.requests), default=0),
            max((r.output_tokens for r in self.requests), default=0),
        )

    def truncated(self, seconds: float | None) -> Workload:
        """The first ``seconds`` of this workload (itself when None or longer)."""
        if seconds is None or seconds >= self.duration_s:
            return self
        kept = [r for r in self.requests if r.arrival_s < seconds]
        return Workload(
            self.name,
            seconds,
            kept,
            dict(self.weights),
            self.kv_tokens,
            self.prefix_block,
            list(self.tree),
            dict(self.parents),
            self.classes,
        )


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
        return _trace_workload(trace)
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


def load_workloads(
    name_or_file: str, seed: int = 42, trace: str | Path | None = None, rate_scale: float = 1.0
) -> list[Workload]:
    """A preset name, a trace CSV, a Mooncake trace (.jsonl), or a YAML/JSON spec file; always a list
    (``ablation`` has six). ``rate_scale`` multiplies the request rates of generated workloads and of
    Mooncake traces (their arrivals come that much faster), not of CSV traces."""
    if rate_scale <= 0:
        raise WorkloadError("rate scale must be positive")
    if name_or_file.lower().endswith(".jsonl"):
        from loadgen.mooncake import load_mooncake

        if not Path(name_or_file).is_file():
            raise WorkloadError(f"workload file {name_or_file!r} does not exist")
        return [load_mooncake(name_or_file, time_scale=rate_scale)]
    is_trace = name_or_file == "real" or name_or_file.lower().endswith(".csv")
    if is_trace and rate_scale != 1.0:
        raise WorkloadError("rate scaling applies to generated workloads, not to traces")
    if name_or_file in PRESETS:
        made = real(seed, trace) if name_or_file == "real" else PRESETS[name_or_file](seed, rate_scale)
        return made if isinstance(made, list) else [made]
    path = Path(name_or_file)
    if path.suffix.lower() in (".csv", ".yaml", ".yml", ".json"):
        if not path.is_file():
            raise WorkloadError(f"workload file {name_or_file!r} does not exist")
        if path.suffix.lower() == ".csv":
            return [_trace_workload(path)]
        return [workload_from_spec(_read_spec(path), seed, default_name=path.stem, scale=rate_scale)]
    raise WorkloadError(
        f"unknown workload {name_or_file!r} (expected one of: {', '.join(PRESETS)}, or a .yaml/.json/.csv/.jsonl file)"
    )


def _trace_workload(path: str | Path) -> Workload:
    try:
        requests, duration = load_trace_csv(path)
    except ValueError as exc:
        raise WorkloadError(str(exc)) from None
    return Workload(Path(path).stem, duration, [TraceRequest(*r) for r in requests])


def _read_spec(path: Path) -> Any:
    try:
        text = path.read_text()
        return json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WorkloadError(f"workload file {path}: cannot parse: {first_line}") from None


def workload_from_spec(spec: Any, seed: int, default_name: str = "custom", scale: float = 1.0) -> Workload:
    """Build a workload from a spec::

    name: mixed
    duration_s: 300
    kv_tokens: 10000            # optional
    tree:                       # optional: the tenant tree, parents first
      - {name: org-a, weight: 1}
      - {name: team-a1, parent: org-a, weight: 2}
    classes:                    # optional: request classes (the first not strict is the default)
      - {name: interactive, weight: 3, ttft_s: 2.0}
      - {name: batch, weight: 1}
    tenants:
      - name: alice
        weight: 1               # optional
        parent: team-a1         # optional: its tree node
        class: batch            # optional: its requests' class (one name may appear once per class)
        rate: 2.0               # req/s (or ``phases: [{start_s, end_s, rate, rate_end, arrival, on_off_s}]``)
        rate_end: 4.0           # optional linear ramp
        arrival: poisson        # uniform (default) | poisson
        on_off_s: 60            # optional
        prompt_len: 256         # a number or [low, high]
        output_len: [64, 512]
    """
    if not isinstance(spec, Mapping):
        raise WorkloadError("workload spec must be a mapping with 'duration_s' and 'tenants'")
    name = str(spec.get("name", default_name))
    duration = _positive(spec.get("duration_s"), "duration_s")
    tenants = spec.get("tenants")
    if not isinstance(tenants, list) or not tenants:
        raise WorkloadError("workload spec: 'tenants' must be a non-empty list")
    specs = [_tenant_spec(i, t, duration) for i, t in enumerate(tenants)]
    if len({(s.name, s.klass) for s in specs}) != len(specs):
        raise WorkloadError("workload spec: tenant names must be unique (per request class)")
    tree, classes = _tree(spec.get("tree") or []), _classes(spec.get("classes") or [])
    _check_tree(tree, classes, specs)
    workload = generate(name, duration, specs, int(spec.get("seed", seed)), scale)
    workload.tree, workload.classes = tree, classes
    if spec.get("kv_tokens") is not None:
        workload.kv_tokens = int(_positive(spec["kv_tokens"], "kv_tokens"))
    return workload


def _tenant_spec(index: int, raw: Any, duration: float) -> TenantSpec:
    where = f"tenants[{index}]"
    if not isinstance(raw, Mapping) or "name" not in raw:
        raise WorkloadError(f"workload spec: {where} must be a mapping with a 'name'")
    known = {
        "name",
        "weight",
        "rate",
        "rate_end",
        "arrival",
        "on_off_s",
        "prompt_len",
        "output_len",
        "phases",
        "parent",
        "class",
    }
    unknown = set(raw) - known
    if unknown:
        raise WorkloadError(f"workload spec: {where} has unknown field(s) {sorted(unknown)}")
    if "phases" in raw:
        if not isinstance(raw["phases"], list) or not raw["phases"]:
            raise WorkloadError(f"workload spec: {where}.phases must be a non-empty list")
        phases = tuple(_phase(f"{where}.phases[{i}]", p, duration) for i, p in enumerate(raw["phases"]))
    elif "rate" in raw:
        phases = (
            _phase(where, {k: raw[k] for k in ("rate", "rate_end", "arrival", "on_off_s") if k in raw}, duration),
        )
    else:
        raise WorkloadError(f"workload spec: {where} needs 'rate' or 'phases'")
    return TenantSpec(
        str(raw["name"]),
        phases,
        _length_range(raw.get("prompt_len", 256), f"{where}.prompt_len", low=0),
        _length_range(raw.get("output_len", 256), f"{where}.output_len", low=1),
        _positive(raw.get("weight", 1.0), f"{where}.weight"),
        str(raw.get("parent") or ""),
        str(raw.get("class") or ""),
    )


def _tree(raw: Any) -> list[tuple[str, str, float]]:
    if not isinstance(raw, list):
        raise WorkloadError("workload spec: 'tree' must be a list of {name, parent, weight}")
    nodes = []
    for i, row in enumerate(raw):
        where = f"tree[{i}]"
        fields_ok = isinstance(row, Mapping) and not set(row) - {"name", "parent", "weight"}
        if not fields_ok or not isinstance(row.get("name"), str):
            raise WorkloadError(f"workload spec: {where} must be a mapping of name, parent, weight")
        weight = _positive(row.get("weight", 1.0), f"{where}.weight")
        nodes.append((row["name"], str(row.get("parent") or ""), weight))
    return nodes


def _classes(raw: Any) -> tuple[RequestClass, ...]:
    if not isinstance(raw, list):
        raise WorkloadError("workload spec: 'classes' must be a list of {name, weight, strict, ttft_s}")
    try:
        return check_classes(RequestClass.from_dict(c) for c in raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkloadError(f"workload spec: classes: {exc}") from None


def _check_tree(tree: list[tuple[str, str, float]], classes: tuple[RequestClass, ...], specs: list[TenantSpec]) -> None:
    """Build the tree once in a scheduler: the core's own checks name what is wrong."""
    from dispatcher.core import FairScheduler, SchedulerConfig

    try:
        sched = FairScheduler(SchedulerConfig(classes=classes))
        for node, parent, weight in tree:
            sched.set_node(node, parent or None, weight)
        for s in specs:
            sched.add_tenant(s.name, s.weight, s.parent or None)
            sched.class_leaf(s.name, s.klass)
    except ValueError as exc:
        raise WorkloadError(f"workload spec: {exc}") from None


def _phase(where: str, raw: Any, duration: float) -> Phase:
    if not isinstance(raw, Mapping):
        raise WorkloadError(f"workload spec: {where} must be a mapping")
    arrival = str(raw.get("arrival", "uniform"))
    if arrival not in ("uniform", "poisson"):
        raise WorkloadError(f"workload spec: {where}.arrival must be 'uniform' or 'poisson', got {arrival!r}")
    start = _number(raw.get("start_s", 0.0), f"{where}.start_s")
    end = _number(raw.get("end_s", duration), f"{where}.end_s")
    if not 0 <= start < end:
        raise WorkloadError(f"workload spec: {where} needs 0 <= start_s < end_s")
    rate_end = raw.get("rate_end")
    on_off = raw.get("on_off_s")
    return Phase(
        start,
        end,
        _positive(raw.get("rate"), f"{where}.rate"),
        None if rate_end is None else _positive(rate_end, f"{where}.rate_end"),
        arrival,
        None if on_off is None else _positive(on_off, f"{where}.on_off_s"),
    )


def _length_range(raw: Any, where: str, low: int) -> tuple[int, int]:
    values = raw if isinstance(raw, list) else [raw, raw]
    if len(values) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise WorkloadError(f"workload spec: {where} must be a whole number or [low, high], got {raw!r}")
    lo, hi = values
    if lo < low or hi < lo:
        raise WorkloadError(f"workload spec: {where} must satisfy {low} <= low <= high, got {raw!r}")
    return lo, hi


def _number(raw: Any, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise WorkloadError(f"workload spec: {where} must be a number, got {raw!r}")
    return float(raw)


def _positive(raw: Any, where: str) -> float:
    value = _number(raw, where)
    if value <= 0:
        raise WorkloadError(f"workload spec: {where} must be positive, got {raw!r}")
    return value
