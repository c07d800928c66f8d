"""The ``fairgate`` command: ``simulate`` and ``bench`` (the gateway's ``serve`` and ``loadgen`` come
with the gateway). Bad input ends with one line naming the problem and exit status 2."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NoReturn

from dispatcher.core import POLICY_NAMES, LinearCost, ProfiledCost, fit_profiled_cost, parse_policy
from dispatcher.core.costs import CostFunction


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fairgate", description="A fair, multi-tenant gateway for LLM serving (VTC).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sim = sub.add_parser("simulate", help="run workloads in virtual time and compare policies")
    sim.add_argument("--workload", required=True, help="a preset name or a .yaml/.json/.csv file")
    sim.add_argument(
        "--policy", action="append", help=f"repeatable; one of {', '.join(POLICY_NAMES)} (default: vtc, fcfs)"
    )
    sim.add_argument("--replicas", type=int, default=1, help="engines behind the one dispatcher")
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
    sim.add_argument("--output-reserve", type=int, help="cap on KV tokens reserved for output per request")
    sim.add_argument("--no-preemption", action="store_true", help="stall instead of preempting on KV shortage")
    sim.add_argument("--block-size", type=int, default=1, help="KV block size in tokens (vLLM: 16, 32 on CPU)")
    sim.add_argument("--max-running", type=int, help="the engine's batch limit (vLLM's max_num_seqs)")
    sim.add_argument("--drain", action="store_true", help="run past the duration until every request ends")
    sim.add_argument("--no-plots", action="store_true")
    sim.add_argument("--no-progress", action="store_true")

    srv = sub.add_parser("serve", help="start the gateway on this machine (local Ray, simulated workers)")
    srv.add_argument("--config", help="gateway YAML (default: the embedded configuration)")
    srv.add_argument("--workers", type=int, help="number of simulated worker replicas")
    srv.add_argument("--policy", help=f"scheduling policy, one of {', '.join(POLICY_NAMES)}")
    srv.add_argument("--port", type=int, default=8000, help="HTTP port on 127.0.0.1")
    srv.add_argument("--engine", choices=("simulated", "vllm"), help="worker engine (default: the config's)")
    srv.add_argument(
        "--model", help="vLLM model: a shape the project builds (tiny, llama3-8b; dummy weights), a path or an HF id"
    )
    srv.add_argument("--kv-tokens", type=int, help="KV pool per worker, in tokens")

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

    prof = sub.add_parser("profile", help="measure an engine's prefill/decode times into a cost profile")
    prof.add_argument("--engine", choices=("vllm",), default="vllm")
    prof.add_argument("--model", default="tiny", help="vLLM model (default: the project's tiny model)")
    prof.add_argument("--kv-tokens", type=int, help="KV pool in tokens (default: vLLM's sizing; 8192 on CPU)")
    prof.add_argument("--max-num-seqs", type=int, help="vLLM's batch limit")
    prof.add_argument("--inputs", default="8,64,256,512", help="comma-separated prompt lengths")
    prof.add_argument("--outputs", default="1,64,128,256", help="comma-separated output lengths")
    prof.add_argument("--out", type=Path, default=Path("out/profile.json"))

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="target", required=True, parser_class=_Parser)
    core = bench_sub.add_parser("core", help="dispatch decisions per second of the pure core")
    core.add_argument("--tenants", default="10,1000,100000", help="comma-separated tenant counts")
    core.add_argument("--decisions", type=int, default=200_000, help="decisions timed per tenant count")
    gw = bench_sub.add_parser("gateway", help="requests/s through the dispatcher; first-token overhead")
    gw.add_argument("--requests", type=int, default=5000, help="requests pushed through the dispatcher")
    gw.add_argument("--samples", type=int, default=100, help="first-token samples each way")
    vb = bench_sub.add_parser("vllm", help="work conservation: a vLLM engine directly vs through the gateway")
    vb.add_argument("--model", default="small", help="vLLM model (default: the project's ~100M 'small', dummy weights)")
    vb.add_argument("--kv-tokens", type=int, default=8192, help="KV pool of the engine, in tokens")
    vb.add_argument("--max-num-seqs", type=int, default=16, help="vLLM's batch limit")
    vb.add_argument("--clients", type=int, default=36, help="closed-loop clients, split 1 : 2 between two tenants")
    vb.add_argument("--max-tokens", type=int, default=32, help="output tokens per request")
    vb.add_argument("--seconds", type=float, default=20.0, help="measuring window, after a warm-up")
    vb.add_argument("--port", type=int, default=8001, help="HTTP port on 127.0.0.1 for the gateway run")
    vb.add_argument("--policies", default="vtc", help="comma-separated gateway policies to run (e.g. vtc,fcfs)")
    vb.add_argument("--num-gpus", type=float, default=0.0, help="GPUs for the gateway's vLLM worker")
    vb.add_argument("--eager", action="store_true", help="no CUDA graphs / compilation (starts faster)")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "simulate":
            return _simulate(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "loadgen":
            return _loadgen(args)
        if args.command == "profile":
            return _profile(args)
        return _bench(args)
    except UsageError as exc:
        print(f"fairgate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fairgate: interrupted", file=sys.stderr)
        return 130


def _cost(args: argparse.Namespace) -> CostFunction:
    if args.cost == "linear":
        if args.w_p < 0 or args.w_q <= 0:
            raise UsageError("--w-p must be >= 0 and --w-q > 0")
        return LinearCost(args.w_p, args.w_q)
    if args.profile is None:
        return ProfiledCost()
    return fit_profiled_cost(_read_profile(args.profile))


def _read_profile(path: Path) -> dict:
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read profile {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"profile {path}: expected an object {{input: {{output: [batch, prefill_s, decode_s]}}}}")
    return data


def _simulate(args: argparse.Namespace) -> int:
    from loadgen.plots import plot_workload
    from loadgen.report import comparison_table, write_report
    from loadgen.simulator import SimulationConfig, simulate
    from loadgen.workloads import WorkloadError, load_workloads
    from workers.engine import StepTimeModel

    policies = args.policy or ["vtc", "fcfs"]
    for p in policies:
        try:
            parse_policy(p)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.replicas < 1:
        raise UsageError("--replicas must be at least 1")
    if args.kv_tokens is not None and args.kv_tokens < 1:
        raise UsageError("--kv-tokens must be positive")
    if args.output_reserve is not None and args.output_reserve < 0:
        raise UsageError("--output-reserve must be >= 0")
    if args.block_size < 1 or (args.max_running is not None and args.max_running < 1):
        raise UsageError("--block-size and --max-running must be positive")
    try:
        workloads = load_workloads(args.workload, seed=args.seed, trace=args.trace, rate_scale=args.rate_scale)
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    try:
        step_model = StepTimeModel.from_profile(_read_profile(args.profile)) if args.profile else None
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
                replicas=args.replicas,
                kv_tokens=args.kv_tokens,
                cost=cost,
                strict_head_of_line=not args.relaxed,
                output_reserve_cap=args.output_reserve,
                preemption=not args.no_preemption,
                block_size=args.block_size,
                max_running=args.max_running,
                seed=args.seed,
                drain=args.drain,
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
    print(f"\nwrote {path}" + ("" if args.no_plots else f" and plots in {args.out}/") + f" ({elapsed:.1f} s)")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from dispatcher.loopback import ray_environment

    ray_environment()  # before anything imports Ray: it reads these at import time
    from dispatcher.config import ConfigError
    from fairgate.serve_cmd import ServeOverrides, serve_main

    if not 1 <= args.port <= 65535:
        raise UsageError("--port must be between 1 and 65535")
    try:
        overrides = ServeOverrides(args.workers, args.policy, args.engine, args.model, args.kv_tokens)
        return serve_main(args.config, overrides, args.port)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _loadgen(args: argparse.Namespace) -> int:
    import asyncio

    import yaml

    from loadgen.plots import plot_workload
    from loadgen.replay import ReplayConfig, replay
    from loadgen.report import comparison_table, write_report
    from loadgen.workloads import WorkloadError, load_workloads

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


def _bench(args: argparse.Namespace) -> int:
    if args.target == "gateway":
        return _bench_gateway(args)
    if args.target == "vllm":
        return _bench_vllm(args)
    from loadgen.bench import bench_core

    try:
        counts = [int(x) for x in args.tenants.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--tenants must be comma-separated whole numbers, got {args.tenants!r}") from None
    if not counts or min(counts) < 1 or args.decisions < 1:
        raise UsageError("--tenants and --decisions must be positive")
    results = bench_core(counts, args.decisions)
    print("dispatch decisions/s (submit + assign + decode charges + finish), best of 5")
    print(f"{'tenants':>10}  {'1,000 queued':>13}  {'all waiting':>12}")
    for n, queued, everyone in results:
        print(f"{n:>10}  {queued:>13,.0f}  {everyone:>12,.0f}")
    if len(results) > 1:
        first, last = results[0], results[-1]
        print(
            f"slowdown {last[0]:,} vs {first[0]:,} tenants: {first[1] / last[1]:.2f}x (1,000 queued), "
            f"{first[2] / last[2]:.2f}x (all waiting)"
        )
    return 0


def _bench_gateway(args: argparse.Namespace) -> int:
    from dispatcher.loopback import ray_environment

    ray_environment()
    from loadgen.bench_gateway import first_token_overhead, telemetry_overhead, tracing_cost_per_request

    if args.requests < 1 or args.samples < 2:
        raise UsageError("--requests must be >= 1 and --samples >= 2")
    rps = telemetry_overhead(args.requests)
    print(
        f"dispatcher: {rps['off']:,.0f} requests/s with its telemetry off, {rps['on']:,.0f} with it on "
        f"({100 * rps['on'] / rps['off']:.0f}%; medians of 3 alternating rounds; submit -> assign -> zero-time "
        "engine -> report -> finish)"
    )
    spans = tracing_cost_per_request()
    print(
        f"tracing (ingress and worker processes): {spans['on']:.0f} us per request with spans exported, "
        f"{spans['off']:.1f} us with tracing off"
    )
    ttft = first_token_overhead(args.samples)
    print(
        f"first token: gateway p50 {ttft['gateway_p50_ms']:.1f} ms, worker Generate directly p50 "
        f"{ttft['direct_p50_ms']:.1f} ms; gateway overhead p50 {ttft['overhead_p50_ms']:.1f} ms, "
        f"p90 {ttft['overhead_p90_ms']:.1f} ms (tracing's share of it: "
        f"{100 * spans['on'] / 1000 / ttft['overhead_p50_ms']:.1f}%)"
    )
    return 0


def _bench_vllm(args: argparse.Namespace) -> int:
    from dispatcher.loopback import ray_environment

    ray_environment()
    from loadgen.bench_vllm import VllmBenchConfig, run_bench

    if min(args.kv_tokens, args.max_num_seqs, args.clients, args.max_tokens) < 1 or args.seconds <= 0:
        raise UsageError("--kv-tokens, --max-num-seqs, --clients, --max-tokens and --seconds must be positive")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        try:
            parse_policy(p)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    config = VllmBenchConfig(
        model=args.model,
        kv_tokens=args.kv_tokens,
        max_num_seqs=args.max_num_seqs,
        clients=args.clients,
        max_tokens=args.max_tokens,
        window_s=args.seconds,
        num_gpus=args.num_gpus,
        enforce_eager=True if args.eager else None,
    )
    results = run_bench(config, args.port, policies)
    direct = results["vLLM alone"].tokens_per_s
    print(
        f"offered load: {args.clients} closed-loop clients {config.split()}, {args.max_tokens} output tokens each, "
        f"{args.seconds:.0f} s measured after a warm-up"
    )
    print(
        f"{'run':<12} {'tokens/s':>9} {'of alone':>9} {'batch':>6} {'alice':>10} {'bob':>10} {'max gap':>9} "
        f"{'2U':>9} {'backlogged':>11}"
    )
    for label, r in results.items():
        line = f"{label:<12} {r.tokens_per_s:>9.1f} {r.tokens_per_s / direct:>9.1%} {r.mean_batch:>6.1f}"
        if r.service is not None:
            line += (
                f" {r.service['alice']:>10,.0f} {r.service['bob']:>10,.0f} {r.max_gap:>9,.0f} {r.two_u:>9,.0f}"
                f" {r.backlogged:>11.0%}"
            )
        print(line)
    return 0


def _profile(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from workers.vllm_engine.profiler import profile
    from workers.vllm_engine.runner import VllmRunner
    from workers.vllm_engine.settings import VllmSettings

    try:
        inputs = [int(x) for x in args.inputs.split(",") if x.strip()]
        outputs = [int(x) for x in args.outputs.split(",") if x.strip()]
    except ValueError:
        raise UsageError("--inputs and --outputs must be comma-separated whole numbers") from None
    if not inputs or not outputs or min(inputs + outputs) < 1:
        raise UsageError("--inputs and --outputs need positive lengths")
    settings = VllmSettings(model=args.model, kv_tokens=args.kv_tokens, max_num_seqs=args.max_num_seqs)

    async def run() -> dict:
        runner = VllmRunner(settings)
        await runner.start(lambda _report: None)
        try:
            print(
                f"engine up: {runner.kv_tokens} KV tokens, blocks of {runner.block_size}, batch <= {runner.max_running}"
            )
            return await profile(runner, inputs, outputs, progress=print)
        finally:
            await runner.stop()

    result = asyncio.run(run())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
