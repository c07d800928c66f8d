"""``fairgate bench locality``: cache-aware fair dispatch against prefix-blind VTC and an unfair
prefix-affinity router, side by side on the Mooncake conversation trace (docs/architecture.md).

Every arm replays the same requests (``loadgen.mooncake``: tenants derived from conversations, one
heavy and three light, blocks salted per tenant) on the same engines: ``replicas`` simulated
GPU-class engines (``StepTimeModel.h200_llama3_8b``, 850,000-token pools, 16-token KV blocks) that
keep a prefix cache, as vLLM does. Arms differ only in what the dispatcher knows and does:

- ``prefix-blind VTC``: no block hashes, no cached counts (today's dispatcher): placement by room;
- ``VTC + prefix placement``: block hashes and exact cached counts, placement by cached prefix;
- ``vtc-locality:Δ``: the same, and the locality slack Δ in the order between tenants;
- ``affinity router (FCFS)``: placement by cached prefix, first come first served;
- ``FCFS``: neither;
- ``ideal cache (ceiling)``: prefix-blind VTC on engines that share one unbounded cache of every block
  any of them prefilled, free (``SimulatedEngine``'s ``ideal_cache``). No placement can skip more
  prefill than that (its hit rate is the trace's whole reuse), so its throughput over prefix-blind
  VTC's is the most that cache-aware placement can gain at this load in VTC's order; a locality slack
  reorders within Δ on top of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.mooncake import load_mooncake
from loadgen.simulator import SimulationConfig, simulate
from workers.engines.simulated.steptime import H200_LLAMA3_8B_KV_TOKENS, StepTimeModel

DEFAULT_SLACKS = (10_000.0, 100_000.0, 1_000_000.0)


@dataclass(frozen=True)
class Arm:
    label: str
    policy: str
    placement: str
    sees_prefix: bool
    ideal_cache: bool = False


CEILING = "ideal cache (ceiling)"


def arms(slacks: tuple[float, ...] = DEFAULT_SLACKS) -> list[Arm]:
    return [
        Arm("prefix-blind VTC", "vtc", "most-room", False),
        Arm("VTC + prefix placement", "vtc", "prefix-affinity", True),
        *(Arm(f"vtc-locality:{d:g}", f"vtc-locality:{d:g}", "prefix-affinity", True) for d in slacks),
        Arm("affinity router (FCFS)", "fcfs", "prefix-affinity", True),
        Arm("FCFS", "fcfs", "most-room", False),
        Arm(CEILING, "vtc", "most-room", False, ideal_cache=True),
    ]


def bench_locality(
    trace: str | Path,
    time_scale: float = 3.0,
    limit: int | None = None,
    replicas: int = 4,
    slacks: tuple[float, ...] = DEFAULT_SLACKS,
) -> dict[str, Any]:
    """One row per arm: throughput, hit rate, the largest backlogged gap against the policy's bound,
    Jain's index, the light tenants' first-token latency; and the headline ratios."""
    workload = load_mooncake(trace, time_scale=time_scale, limit=limit)
    rows = []
    for arm in arms(slacks):
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
        )
        report = simulate(workload, config).report
        tenants = report["tenants"]
        light = [t["mean_ttft_s"] for name, t in tenants.items() if name != "heavy" and t["mean_ttft_s"] is not None]
        rows.append(
            {
                "arm": arm.label,
                "policy": arm.policy,
                "placement": arm.placement,
                "tokens_per_s": report["throughput_tokens_per_s"],
                "output_tokens_per_s": report["output_tokens_per_s"],
                "requests_finished": report["requests_finished"],
                "prefix_hit_rate": report["prefix_hit_rate"] or 0.0,
                "max_backlogged_gap": report["max_abs_service_diff"],
                "bound": report["bound_2u"],
                "bound_held": report["bound_held"],
                "jain_index": report["jain_index"],
                "light_mean_ttft_s": sum(light) / len(light) if light else None,
                "heavy_mean_ttft_s": tenants.get("heavy", {}).get("mean_ttft_s"),
                "hit_rate_by_tenant": {name: t["prefix_hit_rate"] for name, t in tenants.items()},
            }
        )
    by_label = {r["arm"]: r for r in rows}
    blind, router = by_label["prefix-blind VTC"], by_label["affinity router (FCFS)"]
    router_hits = router["prefix_hit_rate"]
    best = max(
        (r for r in rows if r["policy"].startswith("vtc-locality")),
        key=lambda r: r["tokens_per_s"],
    )
    return {
        "trace": str(trace),
        "requests": len(workload.requests),
        "time_scale": time_scale,
        "replicas": replicas,
        "kv_tokens": H200_LLAMA3_8B_KV_TOKENS,
        "rows": rows,
        "best_locality": best["arm"],
        "throughput_vs_blind": best["tokens_per_s"] / blind["tokens_per_s"],
        "ceiling_vs_blind": by_label[CEILING]["tokens_per_s"] / blind["tokens_per_s"],
        "hit_rate_vs_router": best["prefix_hit_rate"] / router_hits if router_hits else None,
    }
