"""``fairgate bench shards``: several dispatcher shards against one dispatcher, in virtual time.

The simulator (``fairgate.loadgen.simulator``) runs the real scheduler core as ``K`` shards, each over
its slice of the simulated engines, their counters exchanged and their waiting requests dealt every
``tau`` (``fairgate.core.shards``). For each workload, shard count and tau: the largest service gap
between backlogged tenants against the stated bound (the single dispatcher's, 2U and its terms, plus
twice the most the fleet served in one round), Jain's index on demand-aware shares, and throughput
(output tokens per second: what the engines generated, not what was charged at dispatch) against the
single dispatcher on the same workload. Workloads: the paper's ``overload`` and
``on_off`` (``on_off_overload``), and ``skew``: ``overload`` with A's requests reaching one shard only
(as through one ingress replica) and B's every shard.
"""

from __future__ import annotations

from typing import Any

from fairgate.core.registry import Param
from fairgate.loadgen.benches.base import Bench, Figures, Options, names, numbers, register
from fairgate.loadgen.simulator import SimulationConfig, simulate
from fairgate.loadgen.workloads import on_off_overload, overload

WORKLOADS = ("overload", "on_off", "skew")


def _workload(name: str, engines: int, seconds: float, seed: int) -> Any:
    make = on_off_overload if name == "on_off" else overload
    return make(seed, scale=engines).truncated(seconds)


def shard_row(name: str, engines: int, shards: int, tau_s: float, seconds: float, seed: int) -> dict[str, Any]:
    """One run's figures: the gap, the bound, Jain's index and throughput, and the rounds' figures."""
    pinned = {"A": 0} if name == "skew" else {}
    config = SimulationConfig(replicas=engines, shards=shards, tau_s=tau_s, pinned=pinned, seed=seed)
    report = simulate(_workload(name, engines, seconds, seed), config).report
    rounds = report.get("shards", {})
    return {
        "workload": name,
        "shards": shards,
        "tau_ms": round(tau_s * 1000),
        "gap": report["max_abs_service_diff"],
        "bound": report["bound_2u"],
        "inside_bound": report["bound_held"],
        "jain": report["jain_index"],
        "throughput": report["output_tokens_per_s"],
        "round_service": rounds.get("round_service", 0.0),
        "moved": rounds.get("moved", 0),
        "finished": report["requests_finished"],
    }


def threshold_rows(engine_counts: tuple[int, ...], threshold: float, seconds: float, seed: int) -> list[dict[str, Any]]:
    """The threshold rule on ``overload`` at each engine count, on and off."""
    rows = []
    for engines in engine_counts:
        w = overload(seed, scale=engines).truncated(seconds)
        off = simulate(w, SimulationConfig(replicas=engines, seed=seed)).report
        on = simulate(w, SimulationConfig(replicas=engines, seed=seed, threshold=threshold)).report
        rule = on["threshold"]
        rows.append(
            {
                "engines": engines,
                "gap": on["max_abs_service_diff"],
                "gap_rule_off": off["max_abs_service_diff"],
                "bound": rule["bound"],
                "inside_bound": rule["inside_bound"],
                "throughput_vs_rule_off": on["output_tokens_per_s"] / off["output_tokens_per_s"],
                "taken": rule["taken"],
                "recomputed_tokens": rule["recomputed_tokens"],
                "recomputed_share": rule["recomputed_share"],
            }
        )
    one, one_off = rows[0]["gap"], rows[0]["gap_rule_off"]
    for row in rows:
        row["gap_vs_one_engine"] = row["gap"] / one if one else float("nan")
        row["gap_vs_one_engine_rule_off"] = row["gap"] / one_off if one_off else float("nan")
    return rows


@register
class ShardsBench(Bench):
    name = "shards"
    help = "K dispatcher shards against one: the fleet's fairness bound, Jain's index and throughput (virtual time)"
    params = (
        Param("workloads", str, ",".join(WORKLOADS), "comma-separated: " + ", ".join(WORKLOADS)),
        Param("engines", int, 64, "simulated engines in the fleet"),
        Param("shards", str, "1,2,4,8", "comma-separated shard counts (1: the single dispatcher, always run)"),
        Param("tau_ms", str, "10,50,200", "comma-separated round intervals, milliseconds"),
        Param("seconds", float, 120.0, "of each workload (virtual time)"),
        Param("seed", int, 0, "of the workloads' arrivals"),
        Param(
            "rule_engines", str, "1,4,16,64", "engine counts of the threshold rule's rows (the first is the reference)"
        ),
        Param("threshold", float, 2500.0, "the threshold rule's gap, cost units"),
        Param("rule_seconds", float, 300.0, "of overload for the threshold rule's rows (virtual time)"),
    )

    def check(self, options: Options) -> None:
        names(options["workloads"], "--workloads", WORKLOADS)
        shards = numbers(options["shards"], "--shards")
        numbers(options["tau_ms"], "--tau-ms", float, least=0.001)
        numbers(options["rule_engines"], "--rule-engines")
        if options["threshold"] < 0 or options["rule_seconds"] <= 0:
            raise ValueError("--threshold must be at least 0 and --rule-seconds positive")
        if options["engines"] < max(shards) or options["seconds"] <= 0:
            raise ValueError("--engines must be at least the largest shard count, and --seconds positive")

    def run(self, options: Options) -> Figures:
        engines, seconds, seed = options["engines"], options["seconds"], options["seed"]
        shard_counts = sorted(set(numbers(options["shards"], "--shards")) - {1})
        taus = numbers(options["tau_ms"], "--tau-ms", float, least=0.001)
        rows = []
        for name in names(options["workloads"], "--workloads", WORKLOADS):
            single = shard_row(name, engines, 1, 1.0, seconds, seed)
            single["throughput_vs_single"] = 1.0
            rows.append(single)
            for k in shard_counts:
                for tau_ms in taus:
                    row = shard_row(name, engines, k, tau_ms / 1000, seconds, seed)
                    row["throughput_vs_single"] = row["throughput"] / single["throughput"]
                    rows.append(row)
        rule = threshold_rows(
            numbers(options["rule_engines"], "--rule-engines"), options["threshold"], options["rule_seconds"], seed
        )
        return {"engines": engines, "seconds": seconds, "rows": rows, "threshold": options["threshold"], "rule": rule}

    def report(self, figures: Figures) -> str:
        out = [
            f"{figures['engines']} simulated engines, {figures['seconds']:g} s of each workload (virtual time)",
            f"{'workload':<9} {'K':>2} {'tau ms':>6} {'gap':>9} {'bound':>10} {'inside':>6} {'jain':>6} "
            f"{'tput/1':>6} {'moved':>6}",
        ]
        for r in figures["rows"]:
            tau = "-" if r["shards"] == 1 else str(r["tau_ms"])
            out.append(
                f"{r['workload']:<9} {r['shards']:>2} {tau:>6} {r['gap']:>9.0f} {r['bound']:>10.0f} "
                f"{'yes' if r['inside_bound'] else 'NO':>6} {r['jain']:>6.3f} {r['throughput_vs_single']:>6.3f} "
                f"{r['moved']:>6}"
            )
        out += [
            "",
            f"the threshold rule at {figures['threshold']:,.0f} on overload (gap: the rule on; vs 1: its 1-engine gap)",
            f"{'engines':>7} {'gap':>8} {'rule off':>9} {'bound':>8} {'inside':>6} {'vs 1':>5} {'tput':>6} "
            f"{'taken':>6} {'recomputed':>10}",
        ]
        for r in figures["rule"]:
            out.append(
                f"{r['engines']:>7} {r['gap']:>8.0f} {r['gap_rule_off']:>9.0f} {r['bound']:>8.0f} "
                f"{'yes' if r['inside_bound'] else 'NO':>6} {r['gap_vs_one_engine']:>5.2f} "
                f"{r['throughput_vs_rule_off']:>6.3f} {r['taken']:>6} {r['recomputed_share']:>10.1%}"
            )
        return "\n".join(out)
