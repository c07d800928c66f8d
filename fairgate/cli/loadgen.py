"""``fairgate loadgen``: replay a workload against any OpenAI-compatible endpoint and write the same
report and plots as the simulator, from what was measured."""

from __future__ import annotations

import argparse
from pathlib import Path

from fairgate.cli.parsing import UsageError


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    lg = sub.add_parser("loadgen", help="replay a workload against an OpenAI-compatible endpoint")
    lg.add_argument("--workload", required=True, help="a preset name or a .yaml/.json/.csv file")
    lg.add_argument("--url", required=True, help="the endpoint's base URL, e.g. http://127.0.0.1:8000/v1")
    lg.add_argument("--keys", type=Path, help="YAML/JSON mapping of workload tenant -> API key")
    lg.add_argument("--model", default="fairgate-sim")
    lg.add_argument("--label", default="endpoint", help="the run's name in the report (e.g. the policy)")
    lg.add_argument("--duration", type=float, help="replay only the first SECONDS of the workload")
    lg.add_argument("--pool-tokens", type=int, default=20_000, help="the endpoint's total KV pool, for 2U")
    lg.add_argument("--rate-scale", type=float, default=1.0, help="multiply a generated workload's rates")
    lg.add_argument("--trace", type=Path, help="trace CSV for the 'real' workload")
    lg.add_argument("--out", type=Path, default=Path("out/loadgen"))
    lg.add_argument("--seed", type=int, default=42)
    lg.add_argument("--no-plots", action="store_true")
    lg.add_argument("--no-progress", action="store_true")
    return lg


def run(args: argparse.Namespace) -> int:
    import asyncio

    import yaml

    from fairgate.loadgen.plots import plot_workload
    from fairgate.loadgen.replay import ReplayConfig, replay
    from fairgate.loadgen.report import comparison_table, write_report
    from fairgate.loadgen.workload import WorkloadError
    from fairgate.loadgen.workload_spec import load_workloads

    try:
        workloads = load_workloads(args.workload, seed=args.seed, trace=args.trace, rate_scale=args.rate_scale)
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    keys: dict[str, str] = {}
    if args.keys is not None:
        try:
            keys = yaml.safe_load(args.keys.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"cannot read keys file {args.keys}: {exc}") from None
        if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
            raise UsageError(f"keys file {args.keys}: expected a mapping of tenant -> API key")
    if args.duration is not None and args.duration <= 0:
        raise UsageError("--duration must be positive")
    reports = []
    for workload in workloads:
        config = ReplayConfig(
            url=args.url,
            keys={str(k): v for k, v in keys.items()},
            model=args.model,
            policy_label=args.label,
            duration_s=args.duration,
            pool_tokens=args.pool_tokens,
            progress=not args.no_progress,
        )
        try:
            summary, _ = asyncio.run(replay(workload, config))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        reports.append(summary.report)
        if not args.no_plots:
            plot_workload(args.out / f"{workload.name}.png", [(summary.report, summary.series)])
    path = write_report(args.out, reports, {"command": "loadgen", "url": args.url, "seed": args.seed})
    print(comparison_table(reports))
    print(f"\nwrote {path}")
    return 0
