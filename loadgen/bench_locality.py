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
