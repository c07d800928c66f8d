"""Workloads by name or file: a preset, a trace CSV, a Mooncake trace (.jsonl), or a YAML/JSON spec of
tenants, their rates and lengths, tree and classes (checked by the core's own rules)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from fairgate.core.classes import RequestClass, check_classes
from fairgate.core.tree import TreeError, check_tree
from fairgate.core.weights import weight_problem
from fairgate.loadgen.mooncake import load_mooncake
from fairgate.loadgen.workload import Workload, WorkloadError
from fairgate.loadgen.workloads import PRESETS, Phase, TenantSpec, generate, real, trace_workload


def load_workloads(
    name_or_file: str, seed: int = 42, trace: str | Path | None = None, rate_scale: float = 1.0
) -> list[Workload]:
    """A preset name, a trace CSV, a Mooncake trace (.jsonl), or a YAML/JSON spec file; always a list
    (``ablation`` has six). ``rate_scale`` multiplies the request rates of generated workloads and of
    Mooncake traces (their arrivals come that much faster), not of CSV traces."""
    if rate_scale <= 0:
        raise WorkloadError("rate scale must be positive")
    if name_or_file.lower().endswith(".jsonl"):
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
            return [trace_workload(path)]
        return [workload_from_spec(_read_spec(path), seed, default_name=path.stem, scale=rate_scale)]
    raise WorkloadError(
        f"unknown workload {name_or_file!r} (expected one of: {', '.join(PRESETS)}, or a .yaml/.json/.csv/.jsonl file)"
    )


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
        _weight(raw.get("weight", 1.0), f"{where}.weight"),
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
        weight = _weight(row.get("weight", 1.0), f"{where}.weight")
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
    """The core's own check of a tree (it names what is wrong), and every class named must exist."""
    known = {c.name for c in classes}
    for s in specs:
        if s.klass and s.klass not in known:
            raise WorkloadError(f"workload spec: tenant {s.name!r}: unknown request class {s.klass!r}")
    tenants = {s.name: (s.name, s.parent, s.weight) for s in reversed(specs)}  # a tenant's first row counts
    try:
        check_tree({name: (parent, weight) for name, parent, weight in tree}, tenants.values())
    except TreeError as exc:
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


def _weight(raw: Any, where: str) -> float:
    if problem := weight_problem(raw):
        raise WorkloadError(f"workload spec: {where}: {problem}")
    return float(raw)


def _positive(raw: Any, where: str) -> float:
    value = _number(raw, where)
    if value <= 0:
        raise WorkloadError(f"workload spec: {where} must be positive, got {raw!r}")
    return value
