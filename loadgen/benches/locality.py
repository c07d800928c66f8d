"""``fairgate bench locality``: cache-aware fair dispatch against prefix-blind VTC and an unfair
prefix-affinity router, side by side, on engines with KV cache tiers (docs/architecture.md).

Two traces: the Mooncake conversation trace (``fairgate.loadgen.mooncake``: tenants derived from
conversations, one heavy and three light, blocks salted per tenant) and generated agent sessions
(``fairgate.loadgen.agent_sessions``: a shape, stated there). Every arm replays the same requests on
``replicas`` simulated GPU-class engines (``StepTimeModel.h200_llama3_8b``, 850,000-token pools,
16-token KV blocks, prefix caches on, as vLLM's) and, except two reference arms, the same tiers
below them (``Tiers``: host memory per engine, a store all of them share). Engines report their KV
cache events; a dispatcher that sees prefixes indexes them. Arms differ in what the dispatcher knows
and does:

- ``prefix-blind VTC (GPU only)``: today's dispatcher on engines without tiers: the baseline of
  every ratio;
- ``prefix-blind VTC``: no block hashes, no cached counts, no events: placement by room;
- ``VTC + prefix placement``: block hashes, exact cached counts and the engines' events, placement by
  the prefill a worker's pool and tiers save;
- ``vtc-locality:Δ``: the same, and the locality slack Δ in the order between tenants;
- ``affinity router (FCFS)``: placement by cached prefix, first come first served;
- ``FCFS``: neither;
- ``ideal cache (ceiling)``: prefix-blind VTC on engines without tiers that share one unbounded cache
  of every block any of them prefilled, free (``SimulatedEngine``'s ``ideal_cache``). No placement
  and no tier can skip more prefill than that (its hit rate is the trace's whole reuse), so its
  throughput over the baseline is the most that caching can gain at this load in VTC's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairgate.core.registry import Param
from fairgate.loadgen.agent_sessions import agent_sessions
from fairgate.loadgen.benches.base import Bench, Figures, Options, numbers, register
from fairgate.loadgen.datasets import MOONCAKE_TRACE
from fairgate.loadgen.mooncake import load_mooncake
from fairgate.loadgen.simulator import Simulation, SimulationConfig
from fairgate.loadgen.workload import Workload
from fairgate.workers.engines.simulated.steptime import H200_LLAMA3_8B_KV_TOKENS, StepTimeModel
from fairgate.workers.engines.simulated.tiers import host_tier, shared_tier

DEFAULT_SLACKS = (10_000.0, 100_000.0, 1_000_000.0)


@dataclass(frozen=True)
class Tiers:
    """The tiers below every engine's pool, in GiB of Llama-3-8B KV (0: none). The defaults model four
    engines of an 8-GPU H200 node with 2 TiB of DRAM: each offloads 128 GiB to host memory (vLLM's
    ``--kv-offloading-size 128``) and the four share a 512 GiB store (an LMCache server or Mooncake
    store on the node), half of the node's DRAM in all (``fairgate.workers.engines.simulated.tiers``)."""

    host_gib: float = 128.0
    shared_gib: float = 512.0

    def label(self) -> str:
        parts = [
            f"host {self.host_gib:g} GiB" if self.host_gib else "",
            f"shared {self.shared_gib:g} GiB" if self.shared_gib else "",
        ]
        return " + ".join(p for p in parts if p) or "none"


@dataclass(frozen=True)
class Arm:
    label: str
    policy: str
    placement: str
    sees_prefix: bool
    ideal_cache: bool = False
    tiered: bool = True


BASELINE = "prefix-blind VTC (GPU only)"
BLIND = "prefix-blind VTC"
ROUTER = "affinity router (FCFS)"
CEILING = "ideal cache (ceiling)"


def arms(slacks: tuple[float, ...] = DEFAULT_SLACKS) -> list[Arm]:
    return [
        Arm(BASELINE, "vtc", "most-room", False, tiered=False),
        Arm(BLIND, "vtc", "most-room", False),
        Arm("VTC + prefix placement", "vtc", "prefix-affinity", True),
        *(Arm(f"vtc-locality:{d:g}", f"vtc-locality:{d:g}", "prefix-affinity", True) for d in slacks),
        Arm(ROUTER, "fcfs", "prefix-affinity", True),
        Arm("FCFS", "fcfs", "most-room", False),
        Arm(CEILING, "vtc", "most-room", False, ideal_cache=True, tiered=False),
    ]


def bench_locality(
    trace: str | Path,
    time_scale: float = 3.0,
    limit: int | None = None,
    replicas: int = 4,
    slacks: tuple[float, ...] = DEFAULT_SLACKS,
    tiers: Tiers | None = None,
) -> dict[str, Any]:
    """Every arm on the Mooncake trace at ``trace`` (module docstring)."""
    workload = load_mooncake(trace, time_scale=time_scale, limit=limit)
    return {"trace": str(trace), **bench_workload(workload, time_scale, replicas, slacks, tiers or Tiers())}


def bench_workload(
    workload: Workload, time_scale: float, replicas: int, slacks: tuple[float, ...], tiers: Tiers
) -> dict[str, Any]:
    """One row per arm: throughput, hit rate and where the hits came from, how often the index agreed
    with the engines, the largest backlogged gap against the policy's bound, Jain's index, first-token
    latency; and the headline ratios against the baseline."""
    rows = [_run_arm(workload, arm, replicas, tiers) for arm in arms(slacks)]
    by_label = {r["arm"]: r for r in rows}
    baseline, router = by_label[BASELINE], by_label[ROUTER]
    router_hits = router["prefix_hit_rate"]
    best = max((r for r in rows if r["policy"].startswith("vtc-locality")), key=lambda r: r["tokens_per_s"])
    fair = [r for r in rows if r["policy"].startswith("vtc") and r["arm"] != CEILING]
    ceiling_gain = by_label[CEILING]["tokens_per_s"] / baseline["tokens_per_s"] - 1.0
    best_gain = best["tokens_per_s"] / baseline["tokens_per_s"] - 1.0
    return {
        "workload": workload.name,
        "requests": len(workload.requests),
        "time_scale": time_scale,
        "replicas": replicas,
        "kv_tokens": H200_LLAMA3_8B_KV_TOKENS,
        "tiers": {"host_gib": tiers.host_gib, "shared_gib": tiers.shared_gib, "label": tiers.label()},
        "rows": rows,
        "best_locality": best["arm"],
        "throughput_vs_blind": best["tokens_per_s"] / baseline["tokens_per_s"],
        "ceiling_vs_blind": by_label[CEILING]["tokens_per_s"] / baseline["tokens_per_s"],
        "share_of_ceiling_gain": best_gain / ceiling_gain if ceiling_gain > 0 else None,
        "vs_blind_on_tiers": best["tokens_per_s"] / by_label[BLIND]["tokens_per_s"],
        "hit_rate_vs_router": best["prefix_hit_rate"] / router_hits if router_hits else None,
        "fair_arms_bound_held": all(r["bound_held"] for r in fair),
    }


def _run_arm(workload: Workload, arm: Arm, replicas: int, tiers: Tiers) -> dict[str, Any]:
    config = SimulationConfig(
        policy=arm.policy,
        placement=arm.placement,
        replicas=replicas,
        kv_tokens=H200_LLAMA3_8B_KV_TOKENS,
        step_model=StepTimeModel.h200_llama3_8b(),
        block_size=16,
        max_running=256,
        sees_prefix=arm.sees_prefix,
        ideal_cache=arm.ideal_cache,
        host_tier=host_tier(tiers.host_gib) if arm.tiered and tiers.host_gib else None,
        shared_tier=shared_tier(tiers.shared_gib) if arm.tiered and tiers.shared_gib else None,
    )
    sim = Simulation(workload, config)
    report = sim.run().report
    tenants = report["tenants"]
    light = [t["mean_ttft_s"] for name, t in tenants.items() if name != "heavy" and t["mean_ttft_s"] is not None]
    prompt = sum(e.prompt_tokens_seen for e in sim.engines)
    loaded = sum(e.loaded_tokens_seen for e in sim.engines)
    return {
        "arm": arm.label,
        "policy": arm.policy,
        "placement": arm.placement,
        "tiers": tiers.label() if arm.tiered else "none",
        "tokens_per_s": report["throughput_tokens_per_s"],
        "output_tokens_per_s": report["output_tokens_per_s"],
        "requests_finished": report["requests_finished"],
        "prefix_hit_rate": report["prefix_hit_rate"] or 0.0,
        "loaded_from_tiers": loaded / prompt if prompt else 0.0,
        "index_agreement": sim.scheduler.prefixes.agreement() if arm.sees_prefix else None,
        "max_backlogged_gap": report["max_abs_service_diff"],
        "bound": report["bound_2u"],
        "bound_held": report["bound_held"],
        "jain_index": report["jain_index"],
        "light_mean_ttft_s": sum(light) / len(light) if light else None,
        "heavy_mean_ttft_s": tenants.get("heavy", {}).get("mean_ttft_s"),
        "hit_rate_by_tenant": {name: t["prefix_hit_rate"] for name, t in tenants.items()},
    }


@register
class LocalityBench(Bench):
    """Cache-aware fair dispatch on the Mooncake trace (and agent sessions) against prefix-blind VTC
    and an affinity router, on simulated engines with KV tiers."""

    name = "locality"
    help = "cache-aware fair dispatch vs prefix-blind VTC and an affinity router"
    params = (
        Param("trace", str, "", "Mooncake conversation trace (default: the one fairgate ships)"),
        Param("time_scale", float, 3.0, "arrivals this many times faster (overload)"),
        Param("requests", int, 0, "only the trace's first N requests (0: all)"),
        Param("replicas", int, 4, "simulated engines"),
        Param("slacks", str, "10000,100000,1000000", "comma-separated Δ of vtc-locality"),
        Param("host_gib", float, 128.0, "each engine's host-memory KV tier (0: none)"),
        Param("shared_gib", float, 512.0, "the KV store all engines share (0: none)"),
        Param("agents_time_scale", float, 2.0, "the second trace (agent sessions) this much faster (0: skip)"),
    )

    def check(self, options: Options) -> None:
        if not self._trace(options).is_file():
            raise ValueError(f"no trace at {self._trace(options)} (give --trace)")
        if options["time_scale"] <= 0 or options["replicas"] < 1 or options["agents_time_scale"] < 0:
            raise ValueError("--time-scale must be positive, --agents-time-scale at least 0 and --replicas at least 1")
        if options["host_gib"] < 0 or options["shared_gib"] < 0 or options["requests"] < 0:
            raise ValueError("--host-gib, --shared-gib and --requests must be at least 0")
        numbers(options["slacks"], "--slacks", float, 0)

    def run(self, options: Options) -> Figures:
        slacks = numbers(options["slacks"], "--slacks", float, 0)
        tiers = Tiers(options["host_gib"], options["shared_gib"])
        limit = options["requests"] or None
        replicas = options["replicas"]
        r = bench_locality(self._trace(options), options["time_scale"], limit, replicas, slacks, tiers)
        if options["agents_time_scale"] > 0:
            agents = agent_sessions(options["agents_time_scale"], limit)
            r["second_trace"] = bench_workload(agents, options["agents_time_scale"], replicas, slacks, tiers)
        return r

    def report(self, figures: Figures) -> str:
        out = format_locality(figures, "Mooncake conversation trace")
        if "second_trace" in figures:
            title = "agent sessions (generated from a shape: loadgen/agent_sessions.py)"
            out += "\n\n" + format_locality(figures["second_trace"], title)
        return out

    @staticmethod
    def _trace(options: Options) -> Path:
        return Path(options["trace"]) if options["trace"] else MOONCAKE_TRACE


def format_locality(r: Figures, title: str) -> str:
    """One trace's table and verdict."""
    out = [
        f"{title}, {r['requests']:,} requests at {r['time_scale']:g}x speed, {r['replicas']} simulated H200 / "
        f"Llama-3-8B engines ({r['kv_tokens']:,}-token pools, prefix caches on; tiers: {r['tiers']['label']}, "
        "except the baseline and the ceiling); tenants: one heavy (55%), three light (15% each)",
        f"{'arm':<28} {'tokens/s':>9} {'done':>6} {'hit':>6} {'tiers':>6} {'agree':>6} {'gap / bound':>26} "
        f"{'jain':>6} {'light TTFT':>10} {'heavy TTFT':>10}",
    ]
    for row in r["rows"]:
        light, heavy, agree = row["light_mean_ttft_s"], row["heavy_mean_ttft_s"], row["index_agreement"]
        agreed = "-" if agree is None else f"{agree:.0%}"
        gap = f"{row['max_backlogged_gap']:,.0f} / {row['bound']:,.0f}{'' if row['bound_held'] else '!'}"
        out.append(
            f"{row['arm']:<28} {row['tokens_per_s']:>9,.0f} {row['requests_finished']:>6} "
            f"{row['prefix_hit_rate']:>6.1%} {row['loaded_from_tiers']:>6.1%} {agreed:>6} "
            f"{gap:>26} {row['jain_index']:>6.3f} "
            f"{'-' if light is None else f'{light:.1f} s':>10} {'-' if heavy is None else f'{heavy:.1f} s':>10}"
        )
    vs_router, share = r["hit_rate_vs_router"], r["share_of_ceiling_gain"]
    ceiling = next(row for row in r["rows"] if row["arm"] == CEILING)
    out.append(
        f"{r['best_locality']}: {r['throughput_vs_blind']:.3f}x the throughput of {BASELINE} "
        f"({'-' if share is None else f'{share:.0%}'} of the ceiling's gain), {r['vs_blind_on_tiers']:.3f}x "
        f"prefix-blind VTC's on the same tiers, {'-' if vs_router is None else f'{vs_router:.0%}'} of the "
        "affinity router's hit rate ('hit': prompt tokens found cached; 'tiers': of them loaded from host or "
        "shared memory; 'agree': starts whose expected cached prefix the engine confirmed; '!' marks a gap over "
        "its bound; FCFS states none, the bound shown is VTC's 2U)"
    )
    out.append(
        f"ceiling: an unbounded cache of every prefilled block on every replica, free, gives "
        f"{r['ceiling_vs_blind']:.3f}x the baseline's throughput, {ceiling['prefix_hit_rate']:.1%} hits"
    )
    return "\n".join(out)
