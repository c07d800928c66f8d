"""``fairgate bench``: the core's decisions per second, the gateway's request rate and first-token
overhead, and a vLLM engine alone against the same engine through the gateway."""

from __future__ import annotations

import argparse
from typing import Any

from fairgate.cli.parsing import UsageError, check_policies, positive_ints


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from fairgate.cli.parsing import Parser
    from fairgate.workers.engines import engine_names

    bench = sub.add_parser("bench", help="benchmarks")
    targets = bench.add_subparsers(dest="target", required=True, parser_class=Parser)
    core = targets.add_parser("core", help="dispatch decisions per second of the pure core")
    core.add_argument("--tenants", default="10,1000,100000", help="comma-separated tenant counts")
    core.add_argument("--decisions", type=int, default=200_000, help="decisions timed per tenant count")
    core.set_defaults(bench=_core)
    gw = targets.add_parser("gateway", help="requests/s through the dispatcher; first-token overhead")
    gw.add_argument("--requests", type=int, default=5000, help="requests pushed through the dispatcher")
    gw.add_argument("--samples", type=int, default=100, help="first-token samples each way")
    gw.set_defaults(bench=_gateway)
    fb = targets.add_parser("flood", help="KV-bound flood: fairgate against a round-robin front, same engines")
    fb.add_argument("--seconds", type=float, default=300.0, help="simulated seconds of each run")
    fb.add_argument("--replicas", default="1,4", help="comma-separated engine counts")
    fb.add_argument("--json", default=None, help="also write the figures to this file")
    fb.set_defaults(bench=_flood)
    rb = targets.add_parser("reservation", help="max_tokens abuse: a greedy tenant against an honest one")
    rb.add_argument("--seconds", type=float, default=300.0, help="simulated seconds of overload")
    rb.add_argument("--policy", default="vtc", help="fairness policy of both runs")
    rb.set_defaults(bench=_reservation)
    lb = targets.add_parser("locality", help="cache-aware fair dispatch vs prefix-blind VTC and an affinity router")
    lb.add_argument("--trace", default=None, help="Mooncake conversation trace (default: the one fairgate ships)")
    lb.add_argument("--time-scale", type=float, default=3.0, help="arrivals this many times faster (overload)")
    lb.add_argument("--requests", type=int, default=None, help="only the trace's first N requests")
    lb.add_argument("--replicas", type=int, default=4, help="simulated engines")
    lb.add_argument("--slacks", default="10000,100000,1000000", help="comma-separated Δ of vtc-locality")
    lb.add_argument("--host-gib", type=float, default=128.0, help="each engine's host-memory KV tier (0: none)")
    lb.add_argument("--shared-gib", type=float, default=512.0, help="the KV store all engines share (0: none)")
    lb.add_argument(
        "--agents-time-scale",
        type=float,
        default=2.0,
        help="the second trace (agent sessions) this much faster (0: skip)",
    )
    lb.add_argument("--json", default=None, help="also write the figures to this file")
    lb.set_defaults(bench=_locality)
    tb = targets.add_parser("tree", help="tenant tree and request classes: per-level shares, first-token objective")
    tb.add_argument("--seconds", type=float, default=1800.0, help="simulated seconds of each run")
    tb.add_argument("--replicas", type=int, default=4, help="simulated engines")
    tb.add_argument("--json", default=None, help="also write the figures to this file")
    tb.set_defaults(bench=_tree)
    sb = targets.add_parser("slo", help="first-token objectives enforced at 2x overload, side by side with queueing")
    sb.add_argument("--seconds", type=float, default=1800.0, help="simulated seconds of each arm")
    sb.add_argument("--seed", type=int, default=3, help="the workload's seed (every arm the same)")
    sb.add_argument("--arms", default="queue,shed,downgrade", help="comma-separated: queue, shed, downgrade")
    sb.add_argument("--json", default=None, help="also write the figures to this file")
    sb.set_defaults(bench=_slo)
    rb = targets.add_parser("revoke", help="revocation by over-service against none, on full engines (simulated)")
    rb.add_argument("--seconds", type=float, default=600.0, help="simulated seconds of traffic per seed")
    rb.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated workload seeds (both arms on each)")
    rb.add_argument("--max-running", type=int, default=16, help="the engines' batch limit (large: KV-bound engines)")
    rb.add_argument("--kv-tokens", type=int, default=20_000, help="each engine's KV pool, in tokens")
    rb.add_argument("--json", default=None, help="also write the figures to this file")
    rb.set_defaults(bench=_revoke)
    ab = targets.add_parser("adapters", help="per-tenant LoRA adapters: fairgate vs adapter-blind VTC vs prefer-loaded")
    ab.add_argument("--seconds", type=float, default=600.0, help="simulated seconds of traffic")
    ab.add_argument("--rate", type=float, default=8.0, help="requests/s over all tenants")
    ab.add_argument("--adapters", type=int, default=50, help="tenants, one adapter each")
    ab.add_argument("--zipf", type=float, default=1.0, help="the popularity's Zipf exponent")
    ab.add_argument("--max-loras", type=int, default=4, help="adapters an engine's batch and GPU hold")
    ab.add_argument("--slack", type=float, default=None, help="fairgate's locality slack (default: the bench's)")
    ab.add_argument("--seed", type=int, default=1, help="the workload's seed (every arm the same)")
    ab.add_argument("--json", default=None, help="also write the figures to this file")
    ab.set_defaults(bench=_adapters)
    qb = targets.add_parser("quota", help="quotas across 4 ingress replicas and a dispatcher SIGKILL; demote")
    qb.add_argument("--clients", type=int, default=4, help="closed loops per flooding key")
    qb.add_argument("--log", default=None, help="write the gateway's output to this file")
    qb.add_argument("--json", default=None, help="also write the figures to this file")
    qb.set_defaults(bench=_quota)
    vb = targets.add_parser("vllm", help="work conservation: a vLLM engine directly vs through the gateway")
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
    vb.set_defaults(bench=_vllm)
    ob = targets.add_parser("openai", help="the gateway against its engine's own OpenAI server, side by side")
    ob.add_argument("--engine", choices=engine_names(), default="simulated")
    ob.add_argument("--model", default=None, help="vLLM model (default tiny); the simulated engine: fairgate-sim")
    ob.add_argument("--kv-tokens", type=int, default=None, help="KV pool (vLLM default 8192, simulated 1,000,000)")
    ob.add_argument("--max-num-seqs", type=int, default=64, help="vLLM's batch limit")
    ob.add_argument("--cpu-threads", type=int, default=1, help="vLLM's CPU kernel threads (unpinned), both arms")
    ob.add_argument("--dtype", default=None, help="vLLM's dtype, both arms (e.g. float32 where bfloat16 kernels fail)")
    ob.add_argument(
        "--engine-cpus",
        default="",
        help="cores for the engine's own processes alone, both arms (e.g. 1): the rest run every other "
        "process, as a GPU host's engine has its device and cores (default: all share every core)",
    )
    ob.add_argument("--concurrency", type=int, default=24, help="streams at once")
    ob.add_argument("--requests", type=int, default=480, help="streamed chat requests per arm and round")
    ob.add_argument("--short-requests", type=int, default=1200, help="1-token completions per arm and round")
    ob.add_argument("--max-tokens", type=int, default=64, help="output tokens per request")
    ob.add_argument(
        "--prompt-words", type=int, default=0, help="words per streamed prompt, none shared (0: one short sentence)"
    )
    ob.add_argument("--step-ms", type=float, default=1.0, help="the simulated engine's step time")
    ob.add_argument("--rounds", type=int, default=4, help="passes of each arm, the other paused (medians are printed)")
    ob.add_argument(
        "--front-doors",
        default="direct,haproxy",
        help="the gateway arms, one per front door: direct, haproxy, serve (comma-separated)",
    )
    ob.add_argument("--json", default=None, help="also write the figures to this file")
    ob.set_defaults(bench=_openai)
    pb = targets.add_parser("peers", help="fairgate against other routers on the same engines and traffic")
    pb.add_argument("--workloads", default="overload,on_off,real,mooncake,skew", help="comma-separated")
    pb.add_argument("--peers", default="sglang-router,vllm-router,ray-serve-llm,litellm", help="comma-separated")
    pb.add_argument("--engine", choices=engine_names(), default="simulated", help="vllm: a small variant on CPU")
    pb.add_argument("--engines", type=int, default=2, help="engines behind every arm")
    pb.add_argument("--model", default=None, help="vLLM model (default tiny)")
    pb.add_argument("--kv-tokens", type=int, default=None, help="each engine's KV pool (simulated 10,000, vLLM 8192)")
    pb.add_argument("--dtype", default=None, help="vLLM's dtype (e.g. float32 where bfloat16 kernels fail)")
    pb.add_argument("--seconds", type=float, default=40.0, help="of each workload, per pass")
    pb.add_argument("--rounds", type=int, default=2, help="passes of each arm, the others paused (medians)")
    pb.add_argument("--out", default="out/peers", help="where the JSON and a plot per workload go")
    pb.add_argument("--log-dir", default=None, help="keep every server's log here")
    pb.add_argument(
        "--controls",
        action="store_true",
        help="also fairgate in arrival order (fcfs): the gateway's own cost apart from the fair order's",
    )
    pb.set_defaults(bench=_peers)
    return bench


def run(args: argparse.Namespace) -> int:
    return args.bench(args)


def _reservation(args: argparse.Namespace) -> int:
    from fairgate.loadgen.bench_reservation import GREEDY_MAX_TOKENS, bench_reservation

    if args.seconds <= 0:
        raise UsageError("--seconds must be positive")
    check_policies([args.policy])
    rows = bench_reservation(args.seconds, policy=args.policy)
    print(
        f"max_tokens abuse, {args.seconds:.0f} simulated s on one A10G engine (10,000 KV tokens): 'greedy' sends "
        f"8-token prompts with max_tokens {GREEDY_MAX_TOKENS:,} that stop after 4 tokens; 'honest' 256 in / 256 out"
    )
    print(
        f"{'front':>12}  {'tokens/s':>9}  {'honest/s':>9}  {'greedy/s':>9}  {'honest':>7}  {'greedy':>7}  gap / bound"
    )
    for r in rows:
        rate, share = r["service_per_s"], r["share"]
        print(
            f"{r['front']:>12}  {r['throughput_tokens_per_s']:>9.0f}  "
            f"{rate['honest']:>9.0f}  {rate['greedy']:>9.0f}  "
            f"{share['honest']:>7.1%}  {share['greedy']:>7.1%}  {r['max_backlogged_gap']:,.0f} / {r['bound']:,.0f}"
            f"{'' if r['bound_held'] else '  (over the bound)'}"
        )
    return 0


def _flood(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from fairgate.loadgen.bench_flood import ARMS, LIGHT, OUTSTANDING, bench_flood, ratio_to_round_robin

    if args.seconds <= 0:
        raise UsageError("--seconds must be positive")
    replicas = positive_ints(args.replicas, "--replicas")
    rows = bench_flood(args.seconds, tuple(replicas))
    ratios = ratio_to_round_robin(rows)
    loops = ", ".join(f"{t} {n}" for t, n in OUTSTANDING.items())
    print(f"KV-bound flood, {args.seconds:.0f} simulated s; closed loops: {loops} outstanding; ~400 in / 300 out")
    print(
        f"{'engines':>7}  {'arm':<34} {'tokens/s':>9} {'vs RR':>6}  {'shares (heavy/light)':>20}  "
        f"{'gap / bound':>17}  {'preempt':>7}  light TTFT"
    )
    for r in rows:
        share = "/".join(f"{v:.0%}" for v in r["share"].values())
        gap = "-" if r["arm"] == ARMS[0].name else f"{r['max_backlogged_gap']:,.0f}"  # no queue to be backlogged in
        ttft = r["light_mean_ttft_s"]
        print(
            f"{r['replicas']:>7}  {r['arm']:<34} {r['throughput_tokens_per_s']:>9.0f}"
            f" {ratios[(r['replicas'], r['arm'])]:>5.2f}x"
            f"  {share:>20}  {gap:>7} / {r['bound']:>7,.0f}  {r['preemptions']:>7}"
            f"  {'-' if ttft is None else f'{ttft:.2f} s'}"
            f"{'' if r['bound_held'] else '  (over the bound)'}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"tenant_light": LIGHT, "rows": rows}, indent=2))
    return 0


def _locality(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from fairgate.loadgen.agent_sessions import agent_sessions
    from fairgate.loadgen.bench_locality import Tiers, bench_locality, bench_workload
    from fairgate.loadgen.datasets import MOONCAKE_TRACE

    trace = Path(args.trace) if args.trace else MOONCAKE_TRACE
    if not trace.is_file():
        raise UsageError(f"no trace at {trace} (give --trace)")
    if args.time_scale <= 0 or args.replicas < 1 or args.agents_time_scale < 0:
        raise UsageError("--time-scale must be positive, --agents-time-scale at least 0 and --replicas at least 1")
    if args.host_gib < 0 or args.shared_gib < 0:
        raise UsageError("--host-gib and --shared-gib must be at least 0")
    try:
        slacks = tuple(float(v) for v in args.slacks.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"--slacks: comma-separated numbers, got {args.slacks!r}") from None
    if not slacks or any(d < 0 for d in slacks):
        raise UsageError("--slacks: at least one number >= 0")
    tiers = Tiers(args.host_gib, args.shared_gib)
    r = bench_locality(trace, args.time_scale, args.requests, args.replicas, slacks, tiers)
    _print_locality(r, "Mooncake conversation trace")
    if args.agents_time_scale > 0:
        agents = agent_sessions(args.agents_time_scale, args.requests)
        r["second_trace"] = bench_workload(agents, args.agents_time_scale, args.replicas, slacks, tiers)
        print()
        _print_locality(r["second_trace"], "agent sessions (generated from a shape: loadgen/agent_sessions.py)")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0


def _print_locality(r: dict[str, Any], title: str) -> None:
    from fairgate.loadgen.bench_locality import BASELINE, CEILING

    print(
        f"{title}, {r['requests']:,} requests at {r['time_scale']:g}x speed, {r['replicas']} simulated H200 / "
        f"Llama-3-8B engines ({r['kv_tokens']:,}-token pools, prefix caches on; tiers: {r['tiers']['label']}, "
        "except the baseline and the ceiling); tenants: one heavy (55%), three light (15% each)"
    )
    print(
        f"{'arm':<28} {'tokens/s':>9} {'done':>6} {'hit':>6} {'tiers':>6} {'agree':>6} {'gap / bound':>26} "
        f"{'jain':>6} {'light TTFT':>10} {'heavy TTFT':>10}"
    )
    for row in r["rows"]:
        light, heavy, agree = row["light_mean_ttft_s"], row["heavy_mean_ttft_s"], row["index_agreement"]
        agreed = "-" if agree is None else f"{agree:.0%}"
        gap = f"{row['max_backlogged_gap']:,.0f} / {row['bound']:,.0f}{'' if row['bound_held'] else '!'}"
        print(
            f"{row['arm']:<28} {row['tokens_per_s']:>9,.0f} {row['requests_finished']:>6} "
            f"{row['prefix_hit_rate']:>6.1%} {row['loaded_from_tiers']:>6.1%} {agreed:>6} "
            f"{gap:>26} {row['jain_index']:>6.3f} "
            f"{'-' if light is None else f'{light:.1f} s':>10} {'-' if heavy is None else f'{heavy:.1f} s':>10}"
        )
    vs_router, share = r["hit_rate_vs_router"], r["share_of_ceiling_gain"]
    ceiling = next(row for row in r["rows"] if row["arm"] == CEILING)
    print(
        f"{r['best_locality']}: {r['throughput_vs_blind']:.3f}x the throughput of {BASELINE} "
        f"({'-' if share is None else f'{share:.0%}'} of the ceiling's gain), {r['vs_blind_on_tiers']:.3f}x "
        f"prefix-blind VTC's on the same tiers, {'-' if vs_router is None else f'{vs_router:.0%}'} of the "
        "affinity router's hit rate ('hit': prompt tokens found cached; 'tiers': of them loaded from host or "
        "shared memory; 'agree': starts whose expected cached prefix the engine confirmed; '!' marks a gap over "
        "its bound; FCFS states none, the bound shown is VTC's 2U)"
    )
    print(
        f"ceiling: an unbounded cache of every prefilled block on every replica, free, gives "
        f"{r['ceiling_vs_blind']:.3f}x the baseline's throughput, {ceiling['prefix_hit_rate']:.1%} hits"
    )


def _tree(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from fairgate.loadgen.bench_tree import bench_tree, format_tree

    if args.seconds < 60 or args.replicas < 1:
        raise UsageError("--seconds must be at least 60 and --replicas at least 1")
    r = bench_tree(args.seconds, args.replicas)
    print(
        f"two organisations 1:3, three teams each (weights 1, 2, 3: ten keys, one key, one key mixing interactive "
        f"3 : batch 1), {args.replicas} simulated A10G engines, {args.seconds:g} simulated s per run"
    )
    print(format_tree(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0


def _slo(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from fairgate.loadgen.bench_slo import ARMS, WARMUP_S, bench_slo, format_slo

    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    if not arms or any(a not in ARMS for a in arms):
        raise UsageError(f"--arms must name some of: {', '.join(ARMS)}")
    if args.seconds < 2 * WARMUP_S:
        raise UsageError(f"--seconds must be at least {2 * WARMUP_S:g}")
    r = bench_slo(args.seconds, args.seed, arms)
    print(format_slo(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0


def _revoke(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from fairgate.loadgen.bench_revoke import RevokeBenchConfig, bench_revoke, format_revoke

    seeds = positive_ints(args.seeds, "--seeds")
    if args.seconds <= 0 or args.max_running < 1 or args.kv_tokens < 1024:
        raise UsageError("--seconds and --max-running must be positive, --kv-tokens at least 1024")
    config = RevokeBenchConfig(
        seeds=tuple(seeds), duration_s=args.seconds, max_running=args.max_running, kv_tokens=args.kv_tokens
    )
    r = bench_revoke(config)
    print(format_revoke(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0


def _adapters(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from fairgate.loadgen.bench_adapters import AdaptersBenchConfig, bench_adapters, format_adapters

    if args.seconds <= 0 or args.rate <= 0 or args.adapters < 10 or args.max_loras < 1 or args.zipf < 0:
        raise UsageError("--seconds and --rate must be positive, --adapters at least 10, --max-loras at least 1")
    if args.slack is not None and not 0 <= args.slack < float("inf"):
        raise UsageError("--slack must be a finite number >= 0")
    config = AdaptersBenchConfig(
        seed=args.seed,
        duration_s=args.seconds,
        rate=args.rate,
        adapters=args.adapters,
        zipf=args.zipf,
        max_loras=args.max_loras,
        max_cpu_loras=max(16, args.max_loras),
        **({} if args.slack is None else {"slack": args.slack}),
    )
    r = bench_adapters(config)
    print(format_adapters(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0


def _quota(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from fairgate.loadgen.bench_quota import BenchQuotaConfig, bench_quota, format_quota

    if args.clients < 1:
        raise UsageError("--clients must be at least 1")
    r = bench_quota(BenchQuotaConfig(clients=args.clients), Path(args.log) if args.log else None)
    print(format_quota(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))
    return 0


def _core(args: argparse.Namespace) -> int:
    from fairgate.loadgen.bench import PREFIX_BLOCKS, bench_core, bench_prefix_index, bench_tree, idle_leaf_bytes

    counts = positive_ints(args.tenants, "--tenants")
    if args.decisions < 1:
        raise UsageError("--decisions must be positive")
    results = bench_core(counts, args.decisions)
    plain, cached, tiered = bench_prefix_index(1000, args.decisions)
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
    print(
        f"prefix index on, 1,000 tenants, 1,000 queued: {plain:,.0f} decisions/s today's core (vtc, most-room), "
        f"{cached:,.0f} with "
        f"the prefix index on (vtc-locality, prefix-affinity, {PREFIX_BLOCKS}-hash prefixes): {cached / plain:.2f}x; "
        f"{tiered:,.0f} with the index fed by tiered KV events (pool and host memory): {tiered / plain:.2f}x"
    )
    flat, tree = bench_tree(args.decisions)
    print(
        f"tenant tree, 1,000 queued: {tree:,.0f} decisions/s with 10,000 leaves in 3 levels (10 organisations x 10 "
        f"teams x 100 keys), {flat:,.0f} flat at 1,000 tenants: {tree / flat:.2f}x; "
        f"{idle_leaf_bytes():,.0f} bytes per idle leaf"
    )
    return 0


def _gateway(args: argparse.Namespace) -> int:
    from fairgate.common.loopback import ray_environment

    ray_environment()  # before anything imports Ray: it reads these at import time
    from fairgate.loadgen.bench_gateway import first_token_overhead, telemetry_overhead, tracing_cost_per_request

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


def _openai(args: argparse.Namespace) -> int:
    import json

    from fairgate.common.loopback import FRONT_DOORS
    from fairgate.loadgen.bench_openai import OpenAIBenchConfig, bench_openai

    if min(args.concurrency, args.requests, args.short_requests, args.max_tokens, args.max_num_seqs) < 1:
        raise UsageError("--concurrency, --requests, --short-requests, --max-tokens, --max-num-seqs must be positive")
    if args.step_ms < 0:
        raise UsageError("--step-ms must not be negative")
    doors = [d.strip() for d in args.front_doors.split(",") if d.strip()]
    if not doors or any(d not in FRONT_DOORS for d in doors):
        raise UsageError(f"--front-doors: a list of {', '.join(FRONT_DOORS)}")
    from fairgate.workers.engines import engine_for

    plugin = engine_for(args.engine)
    options = {"model": args.model, "kv_tokens": args.kv_tokens, "max_num_seqs": args.max_num_seqs}
    options |= {"cpu_threads": args.cpu_threads, "step_ms": args.step_ms, "dtype": args.dtype}
    settings, model = plugin.benchmark_settings(options)
    config = OpenAIBenchConfig(args.engine, settings, model)
    config.concurrency, config.requests, config.max_tokens = args.concurrency, args.requests, args.max_tokens
    config.short_requests, config.prompt_words = args.short_requests, max(0, args.prompt_words)
    if args.engine_cpus:
        from fairgate.loadgen.cpu_split import parse_cpus

        if not plugin.engine_process_titles:
            raise UsageError(
                f"--engine-cpus: the {args.engine} engine runs inside its worker, with no processes to pin"
            )
        try:
            config.engine_cpus = tuple(sorted(parse_cpus(args.engine_cpus)))
        except ValueError as e:
            raise UsageError(f"--engine-cpus: {e}") from None
    rounds = max(1, args.rounds)
    out = bench_openai(config, doors, rounds=rounds)
    print(
        f"{args.engine} engine, streaming chat: {args.concurrency} streams x {args.max_tokens} output tokens"
        f"{f', {config.prompt_words}-word prompts' if config.prompt_words else ''}, "
        f"{args.requests} requests per arm and round; light load: 1 stream; short: 1-token completions, "
        f"{config.short_concurrency} at once; medians of {rounds} rounds, each arm measured with the other paused"
    )
    if args.engine_cpus:
        n = out["pinned_processes"]
        print(
            f"engine processes on CPUs {args.engine_cpus} alone ({n['engine']} of both arms); every other "
            f"process ({n['host']}) on the rest"
        )
    print(
        f"{'':<26} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'light TTFT':>11} {'short req/s':>12} {'errors':>7}"
        f" {'engine CPU':>11} {'host CPU':>9}"
    )
    labels = {"alone": plugin.reference_name} | {d: f"fairgate, {d} front door" for d in doors}
    for arm, row in out["arms"].items():
        print(
            f"{labels[arm]:<26} {row['output_tokens_per_s']:>9.0f} {row['ttft_p50_ms']:>7.1f}ms "
            f"{row['ttft_p99_ms']:>7.1f}ms {row['light_ttft_p50_ms']:>9.1f}ms {row['short_requests_per_s']:>12.1f} "
            f"{row['errors']:>7} {row['engine_cpu_busy']:>11.0%} {row['host_cpu_busy']:>9.0%}"
        )
    print("(engine / host CPU: how busy those cores were in the loaded phase; engine: with --engine-cpus only)")
    for arm, row in out["arms"].items():
        if row["error_kinds"]:
            kinds = ", ".join(f"{n} x {kind}" for kind, n in sorted(row["error_kinds"].items()))
            print(f"errors of {labels[arm]}: {kinds}")
    for door, r in out["ratios"].items():
        print(
            f"fairgate ({door}) / alone: {r['output_tokens_per_s']:.2f}x tokens/s, "
            f"{r['short_requests_per_s']:.2f}x short requests/s; TTFT p50 {r['ttft_p50_ms_overhead']:+.1f} ms "
            f"loaded, {r['light_ttft_p50_ms_overhead']:+.1f} ms at light load"
        )
        each = " ".join(f"{x['output_tokens_per_s']:.2f}" for x in out["round_ratios"][door])
        print(f"  each round's tokens/s ratio (medians above): {each}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


def _vllm(args: argparse.Namespace) -> int:
    from fairgate.common.loopback import ray_environment

    ray_environment()
    from fairgate.loadgen.bench_vllm import VllmBenchConfig, run_bench

    if min(args.kv_tokens, args.max_num_seqs, args.clients, args.max_tokens) < 1 or args.seconds <= 0:
        raise UsageError("--kv-tokens, --max-num-seqs, --clients, --max-tokens and --seconds must be positive")
    policies = check_policies([p.strip() for p in args.policies.split(",") if p.strip()])
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


def _peers(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from fairgate.loadgen.peers.bench import PeersBenchConfig, bench_peers
    from fairgate.loadgen.peers.report import format_peers, plot_peers
    from fairgate.loadgen.peers.routers import PEERS
    from fairgate.loadgen.peers.workloads import NAMES

    workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    peers = tuple(p.strip() for p in args.peers.split(",") if p.strip())
    if not workloads or any(w not in NAMES for w in workloads):
        raise UsageError(f"--workloads: a list of {', '.join(NAMES)}")
    if any(p not in PEERS for p in peers):
        raise UsageError(f"--peers: a list of {', '.join(PEERS)}")
    missing = [p for p in peers if not PEERS[p].installed()]
    if missing:
        raise UsageError(f"not installed: {', '.join(missing)} (bash scripts/setup_peers.sh installs every peer)")
    if args.engines < 1 or args.rounds < 1 or args.seconds <= 0:
        raise UsageError("--engines, --rounds and --seconds must be positive")
    config = PeersBenchConfig(
        args.engine, args.engines, args.seconds, args.rounds, workloads, peers, controls=args.controls
    )
    if args.engine != PeersBenchConfig.engine:  # another engine than the default's: its benchmark settings
        from fairgate.workers.engines import engine_for

        options = {"model": args.model, "kv_tokens": args.kv_tokens, "dtype": args.dtype, "cpu_threads": 1}
        config.settings, config.model = engine_for(args.engine).benchmark_settings(options)
    elif args.kv_tokens:
        config.settings = {**config.settings, "kv_tokens": args.kv_tokens}
    log_dir = Path(args.log_dir) if args.log_dir else None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    out = bench_peers(config, log_dir)
    where = Path(args.out)
    where.mkdir(parents=True, exist_ok=True)
    (where / "peers.json").write_text(json.dumps(out, indent=1))
    for name, w in out["workloads"].items():
        plot_peers(where / f"peers-{name}.png", name, w)
    print(format_peers(out))
    print(f"\nwrote {where / 'peers.json'} and a plot per workload")
    return 0
