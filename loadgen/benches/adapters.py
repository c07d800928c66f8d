"""``fairgate bench adapters``: per-tenant LoRA adapters served fairly, against adapter-blind VTC and a
prefer-loaded router, side by side on the same traffic (docs/results.md, "Adapters").

Each tenant brings one adapter (the VTC paper's setting: each client a LoRA adapter on one shared base
model), their popularity Zipf-distributed, the pool overloaded. The simulated engines hold at most
``max_loras`` adapters in a batch and on the GPU, and pay the loads (``fairgate.workers.engines.simulated.adapters``).
Arms, each through the same core and engine model:

- ``fairgate``: VTC with locality slack (``vtc-locality``) and the ``adapter-affinity`` placement, the
  dispatcher knowing each engine's adapter slots (a request goes where its adapter may join the
  batch; a cold adapter gets room made for it, others going within the slack meanwhile);
- ``blind``: VTC and ``most-room``, the dispatcher not knowing adapters (engines skip what their batch
  has no room for);
- ``affinity``: first come first served with adapter affinity (``fcfs``, ``adapter-affinity``,
  relaxed head of line: the next request whose adapter fits goes), what a prefer-loaded router gives.

Figures per arm: throughput (tokens/s), each decile of adapters' p99 first-token time (coldest and
hottest tenth by popularity), adapter loads, and whether every backlogged pair stayed inside the
scheduler's stated bound; ``throughput_vs_affinity`` and ``cold_hot_p99_ttft_ratio`` are fairgate's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fairgate.core.registry import Param
from fairgate.loadgen.benches.base import Bench, Figures, Options, register
from fairgate.loadgen.metrics import quantile
from fairgate.loadgen.simulator import Simulation, SimulationConfig
from fairgate.loadgen.workload import TraceRequest, Workload
from fairgate.workers.engines.simulated import AdapterSettings

ARMS: dict[str, dict[str, Any]] = {
    "fairgate": {"policy": "vtc-locality", "placement": "adapter-affinity"},
    "blind": {"policy": "vtc", "placement": "most-room", "sees_adapters": False},
    "affinity": {"policy": "fcfs", "placement": "adapter-affinity", "strict_head_of_line": False},
}


@dataclass(frozen=True)
class AdaptersBenchConfig:
    """The run's shape: ``adapters`` tenants of one adapter each, Zipf(``zipf``) popularity, Poisson
    arrivals at ``rate`` requests/s in all, for ``duration_s``; then everything admitted drains."""

    seed: int = 1
    duration_s: float = 600.0
    replicas: int = 4
    adapters: int = 50
    zipf: float = 1.0
    rate: float = 8.0
    max_loras: int = 4
    max_cpu_loras: int = 16
    kv_tokens: int = 10_000
    max_running: int = 32
    prompt: tuple[int, int] = (128, 512)
    output: tuple[int, int] = (64, 256)
    slack: float = 100_000.0  # fairgate's locality slack Δ (docs/results.md: what it buys, what it costs)
    arms: tuple[str, ...] = tuple(ARMS)


def tenant_of(rank: int) -> str:
    return f"t{rank:02d}"


def adapter_of(rank: int) -> str:
    return f"lora-{rank:02d}"


def popularity(n: int, s: float) -> np.ndarray:
    """Zipf(s) shares of ``n`` adapters, the most popular first."""
    weights = 1.0 / np.arange(1, n + 1) ** s
    return weights / weights.sum()


def adapters_workload(config: AdaptersBenchConfig) -> Workload:
    """Poisson arrivals; each request's adapter (and tenant) drawn by popularity, its sizes uniform."""
    rng = np.random.default_rng(config.seed)
    shares = popularity(config.adapters, config.zipf)
    n = rng.poisson(config.rate * config.duration_s)
    arrivals = np.sort(rng.uniform(0.0, config.duration_s, n))
    ranks = rng.choice(config.adapters, size=n, p=shares)
    prompts = rng.integers(config.prompt[0], config.prompt[1] + 1, n)
    outputs = rng.integers(config.output[0], config.output[1] + 1, n)
    requests = [
        TraceRequest(tenant_of(int(k)), float(t), int(p), int(o), adapter=adapter_of(int(k)))
        for t, k, p, o in zip(arrivals, ranks, prompts, outputs, strict=True)
    ]
    weights = {tenant_of(k): 1.0 for k in range(config.adapters)}
    return Workload("adapters", config.duration_s, requests, weights)


def run_arm(config: AdaptersBenchConfig, arm: str) -> dict[str, Any]:
    """One arm on the workload: throughput, p99 first-token time per decile of adapters, loads, bound."""
    workload = adapters_workload(config)
    settings = AdapterSettings(max_loras=config.max_loras, max_cpu_loras=config.max_cpu_loras)
    sim_config = replace(
        SimulationConfig(
            replicas=config.replicas,
            kv_tokens=config.kv_tokens,
            max_running=config.max_running,
            adapters=settings,
            seed=config.seed,
            drain=True,
        ),
        **ARMS[arm],
    )
    if arm == "fairgate":
        sim_config.policy = f"vtc-locality:{config.slack:g}"
    sim = Simulation(workload, sim_config)
    report = sim.run().report
    rec = sim.recorder
    by_rank: dict[int, list[float]] = {}
    for r in rec.requests.values():
        if r.first_token_s is not None:
            by_rank.setdefault(int(rec.tenants[r.tenant][1:]), []).append(r.first_token_s - r.arrival_s)
    tenth = max(1, config.adapters // 10)
    hot = _p99([x for k in range(tenth) for x in by_rank.get(k, [])])
    cold = _p99([x for k in range(config.adapters - tenth, config.adapters) for x in by_rank.get(k, [])])
    caches = [e.adapters for e in sim.engines if e.adapters is not None]
    return {
        "throughput_tokens_per_s": report["throughput_tokens_per_s"],
        "hot_p99_ttft_s": hot,
        "cold_p99_ttft_s": cold,
        "cold_hot_p99_ttft_ratio": cold / hot if cold is not None and hot else None,
        "all_p99_ttft_s": _p99([x for xs in by_rank.values() for x in xs]),
        "gpu_loads": sum(c.gpu_loads for c in caches),
        "disk_loads": sum(c.disk_loads for c in caches),
        "load_s": sum(c.load_s for c in caches),
        "max_gap": report["max_abs_service_diff"],
        "bound": report["bound_2u"],
        "bound_held": report["bound_held"],
        "requests": len(workload.requests),
    }


def bench_adapters(config: AdaptersBenchConfig | None = None) -> dict[str, Any]:
    config = config or AdaptersBenchConfig()
    arms = {arm: run_arm(config, arm) for arm in config.arms}
    out: dict[str, Any] = {"config": config.__dict__ | {"arms": list(config.arms)}, "arms": arms}
    fair = arms.get("fairgate")
    if fair is not None:
        affinity = arms.get("affinity")
        out["throughput_vs_affinity"] = (
            fair["throughput_tokens_per_s"] / affinity["throughput_tokens_per_s"] if affinity else None
        )
        out["cold_hot_p99_ttft_ratio"] = fair["cold_hot_p99_ttft_ratio"]
        out["bound_held"] = fair["bound_held"]
    return out


def _p99(xs: Sequence[float]) -> float | None:
    return quantile(sorted(xs), 0.99)


def format_adapters(result: Mapping[str, Any]) -> str:
    c = result["config"]
    lines = [
        f"{c['replicas']} simulated A10G engines, batch {c['max_running']}, KV {c['kv_tokens']} tokens, at most "
        f"{c['max_loras']} adapters on each GPU ({c['max_cpu_loras']} in host memory); {c['adapters']} tenants of "
        f"one adapter each, Zipf {c['zipf']:g} popularity, {c['rate']:g} req/s for {c['duration_s']:g} s",
        f"{'arm':<9} {'tokens/s':>9} {'hot p99 s':>10} {'cold p99 s':>11} {'cold/hot':>9} {'loads':>7} "
        f"{'from disk':>10} {'max gap':>8} {'bound':>8} {'held':>5}",
    ]
    for arm, r in result["arms"].items():
        ratio = r["cold_hot_p99_ttft_ratio"]
        lines.append(
            f"{arm:<9} {r['throughput_tokens_per_s']:>9.0f} {r['hot_p99_ttft_s'] or 0:>10.2f} "
            f"{r['cold_p99_ttft_s'] or 0:>11.2f} {ratio if ratio is not None else float('nan'):>9.2f} "
            f"{r['gpu_loads']:>7} {r['disk_loads']:>10} {r['max_gap']:>8.0f} {r['bound']:>8.0f} "
            f"{'yes' if r['bound_held'] else 'NO':>5}"
        )
    if result.get("throughput_vs_affinity") is not None:
        lines.append(
            f"fairgate: throughput {result['throughput_vs_affinity']:.3f}x the prefer-loaded router's; cold / hot "
            f"adapters' p99 first token {result['cold_hot_p99_ttft_ratio']:.2f}x; bound held: {result['bound_held']}"
        )
    return "\n".join(lines)


@register
class AdaptersBench(Bench):
    """Per-tenant LoRA adapters (Zipf popularity) on simulated engines holding a few each: fairgate
    against adapter-blind VTC and a prefer-loaded router."""

    name = "adapters"
    help = "per-tenant LoRA adapters: fairgate vs adapter-blind VTC vs prefer-loaded"
    params = (
        Param("seconds", float, 600.0, "simulated seconds of traffic"),
        Param("rate", float, 8.0, "requests/s over all tenants"),
        Param("adapters", int, 50, "tenants, one adapter each"),
        Param("zipf", float, 1.0, "the popularity's Zipf exponent"),
        Param("max_loras", int, 4, "adapters an engine's batch and GPU hold"),
        Param("slack", float, -1.0, "fairgate's locality slack (negative: the bench's)"),
        Param("seed", int, 1, "the workload's seed (every arm the same)"),
    )

    def check(self, options: Options) -> None:
        o = options
        if o["seconds"] <= 0 or o["rate"] <= 0 or o["adapters"] < 10 or o["max_loras"] < 1 or o["zipf"] < 0:
            raise ValueError("--seconds and --rate must be positive, --adapters at least 10, --max-loras at least 1")
        if o["slack"] == float("inf"):
            raise ValueError("--slack must be a finite number >= 0")

    def run(self, options: Options) -> Figures:
        o = options
        config = AdaptersBenchConfig(
            seed=o["seed"],
            duration_s=o["seconds"],
            rate=o["rate"],
            adapters=o["adapters"],
            zipf=o["zipf"],
            max_loras=o["max_loras"],
            max_cpu_loras=max(16, o["max_loras"]),
            **({} if o["slack"] < 0 else {"slack": o["slack"]}),
        )
        return bench_adapters(config)

    def report(self, figures: Figures) -> str:
        return format_adapters(figures)
