"""``fairgate simulate``: run workloads in virtual time through the real core and engine model, compare
policies, write ``report.json`` and PNG plots."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fairgate.cli.parsing import UsageError, check_policies, read_profile
from fairgate.core import LinearCost, ProfiledCost, fit_profiled_cost, placement_names, policy_usages
from fairgate.core.costs import CostFunction
from fairgate.workers.engines.simulated.model import PREEMPT_BY
from fairgate.workers.engines.simulated.settings import STEP_PRESETS


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    sim = sub.add_parser("simulate", help="run workloads in virtual time and compare policies")
    sim.add_argument(
        "--workload", required=True, help="a preset name, a .yaml/.json/.csv file, or a Mooncake trace (.jsonl)"
    )
    sim.add_argument(
        "--policy", action="append", help=f"repeatable; one of {', '.join(policy_usages())} (default: vtc, fcfs)"
    )
    sim.add_argument("--replicas", type=int, default=1, help="engines behind the one dispatcher")
    sim.add_argument("--placement", default="most-room", help=f"placement rule ({', '.join(placement_names())})")
    sim.add_argument(
        "--engine", choices=sorted(STEP_PRESETS), help="the engine's step-time preset (default: a10g-llama7b)"
    )
    sim.add_argument("--w-c", type=float, default=None, help="linear cost of a cached prompt token (default w_p/10)")
    sim.add_argument("--kv-tokens", type=int, help="KV pool per engine (default: the workload's, or 10000)")
    sim.add_argument("--out", type=Path, default=Path("out/simulate"), help="where report.json and PNGs go")
    sim.add_argument("--seed", type=int, default=42)
    sim.add_argument("--rate-scale", type=float, default=1.0, help="multiply a generated workload's rates")
    sim.add_argument("--duration", type=float, help="simulate only the first SECONDS of the workload")
    sim.add_argument("--trace", type=Path, help="trace CSV for the 'real' workload (default: synthesised)")
    sim.add_argument("--profile", type=Path, help="cost profile JSON to calibrate the engine's step time")
    sim.add_argument("--cost", choices=("linear", "profiled"), default="linear", help="VTC's cost function")
    sim.add_argument("--w-p", type=float, default=1.0, help="linear cost weight of a prompt token")
    sim.add_argument("--w-q", type=float, default=2.0, help="linear cost weight of an output token")
    sim.add_argument("--relaxed", action="store_true", help="relax the head-of-line rule")
    sim.add_argument("--no-preemption", action="store_true", help="stall instead of preempting on KV shortage")
    sim.add_argument(
        "--preempt-by",
        choices=PREEMPT_BY,
        default="newest",
        help="the engines' preemption victims: the newest (vLLM's default) or by the dispatcher's rank",
    )
    sim.add_argument("--watermark", type=float, default=0.0, help="KV fraction the engines keep free when admitting")
    sim.add_argument("--block-size", type=int, default=1, help="KV block size in tokens (vLLM: 16, 32 on CPU)")
    sim.add_argument("--max-running", type=int, help="the engine's batch limit (vLLM's max_num_seqs)")
    sim.add_argument("--drain", action="store_true", help="run past the duration until every request ends")
    sim.add_argument("--revoke", action="store_true", help="revocation by over-service (the gateway's default)")
    sim.add_argument(
        "--report-interval",
        type=float,
        default=0.0,
        help="SECONDS an engine's step reports are merged for, as a worker's pace (the bound grows with it)",
    )
    sim.add_argument(
        "--shards", type=int, default=1, help="dispatcher shards, each over a slice of the replicas (1: one dispatcher)"
    )
    sim.add_argument("--tau-ms", type=float, default=50.0, help="the shards' rounds: counters exchanged this often")
    sim.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="TENANT=SHARD",
        help="a tenant whose requests reach one shard only (as through one ingress replica); repeatable",
    )
    sim.add_argument(
        "--threshold",
        type=float,
        help="COST: take back running requests of a tenant this far ahead of the least-served waiting one",
    )
    sim.add_argument("--no-plots", action="store_true")
    sim.add_argument("--no-progress", action="store_true")
    return sim


def run(args: argparse.Namespace) -> int:
    from fairgate.loadgen.plots import plot_workload
    from fairgate.loadgen.report import comparison_table, write_report
    from fairgate.loadgen.simulator import SimulationConfig, simulate
    from fairgate.loadgen.workload import WorkloadError
    from fairgate.loadgen.workload_spec import load_workloads
    from fairgate.workers.engines.simulated import StepTimeModel

    policies = check_policies(args.policy or ["vtc", "fcfs"])
    if args.placement not in placement_names():
        raise UsageError(f"unknown placement {args.placement!r} (expected one of: {', '.join(placement_names())})")
    if args.replicas < 1:
        raise UsageError("--replicas must be at least 1")
    if args.kv_tokens is not None and args.kv_tokens < 1:
        raise UsageError("--kv-tokens must be positive")
    if not 0.0 <= args.watermark < 1.0:
        raise UsageError("--watermark must be in [0, 1)")
    if args.block_size < 1 or (args.max_running is not None and args.max_running < 1):
        raise UsageError("--block-size and --max-running must be positive")
    if not args.report_interval >= 0:
        raise UsageError("--report-interval must be at least 0")
    if not 1 <= args.shards <= args.replicas or not args.tau_ms > 0:
        raise UsageError("--shards must be 1 to --replicas, and --tau-ms positive")
    pinned = _pins(args.pin, args.shards)
    if args.threshold is not None and not args.threshold >= 0:
        raise UsageError("--threshold must be at least 0")
    try:
        workloads = load_workloads(args.workload, seed=args.seed, trace=args.trace, rate_scale=args.rate_scale)
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    try:
        step_model = StepTimeModel.from_profile(read_profile(args.profile)) if args.profile else None
        if step_model is None and args.engine:
            step_model = STEP_PRESETS[args.engine]()
        cost = _cost(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be positive")
    workloads = [w.truncated(args.duration) for w in workloads]
    started = time.perf_counter()
    reports = []
    for workload in workloads:
        pairs = []
        for policy in policies:
            config = SimulationConfig(
                policy=policy,
                placement=args.placement,
                replicas=args.replicas,
                kv_tokens=args.kv_tokens,
                cost=cost,
                strict_head_of_line=not args.relaxed,
                preemption=not args.no_preemption,
                preempt_by=args.preempt_by,
                watermark=args.watermark,
                block_size=args.block_size,
                max_running=args.max_running,
                seed=args.seed,
                drain=args.drain,
                revoke=args.revoke,
                report_interval_s=args.report_interval,
                shards=args.shards,
                tau_s=args.tau_ms / 1000,
                pinned=pinned,
                threshold=args.threshold,
            )
            if step_model is not None:
                config.step_model = step_model
            summary = simulate(workload, config, progress=not args.no_progress)
            reports.append(summary.report)
            pairs.append((summary.report, summary.series))
        if not args.no_plots:
            plot_workload(args.out / f"{workload.name}.png", pairs)
    elapsed = time.perf_counter() - started
    path = write_report(
        args.out,
        reports,
        {"command": "simulate", "seed": args.seed, "cost": cost.spec(), "wall_s": round(elapsed, 2)},
    )
    print(comparison_table(reports))
    for run in reports:
        for node, row in (run.get("siblings") or {}).items():  # a tenant tree: the bound per sibling pair
            pair = " / ".join(row["pair"] or ["-"])
            held = "held" if row["held"] else "NOT held"
            gap = row["max_gap_over_bound"]
            print(f"{run['workload']}/{run['policy']}  {node}: largest sibling gap {gap:.3f} of bound ({pair}), {held}")
    print(f"\nwrote {path}" + ("" if args.no_plots else f" and plots in {args.out}/") + f" ({elapsed:.1f} s)")
    return 0


def _cost(args: argparse.Namespace) -> CostFunction:
    if args.cost == "linear":
        if args.w_p < 0 or args.w_q <= 0:
            raise UsageError("--w-p must be >= 0 and --w-q > 0")
        if args.w_c is not None and not 0 <= args.w_c <= args.w_p:
            raise UsageError("--w-c must be between 0 and --w-p")
        return LinearCost(args.w_p, args.w_q, args.w_c)
    if args.profile is None:
        return ProfiledCost()
    return fit_profiled_cost(read_profile(args.profile))


def _pins(pins: list[str], shards: int) -> dict[str, int]:
    """``--pin TENANT=SHARD`` options as a mapping, each shard in range."""
    out = {}
    for pin in pins:
        tenant, _, shard = pin.partition("=")
        if not tenant or not shard.isdigit() or int(shard) >= shards:
            raise UsageError(f"--pin {pin!r}: TENANT=SHARD with SHARD from 0 to {shards - 1}")
        out[tenant] = int(shard)
    return out
