"""``fairgate bench revoke``: revocation by over-service against none, side by side on the same traffic
(docs/results.md, "Revocation by over-service").

One tenant floods two simulated A10G engines (closed loops: many clients, each sending its next request
as its last one ends) whose batches are full (``max_running``) while a light tenant sends short
requests now and then: the engines' queues hold the flood's unstarted requests.
Each seed's workload runs twice, revocation off and on, through the same core and engine model; the
figures per arm are medians over the seeds:

- the light tenant's first-token times (p50, p99, mean) and the ratio off / on of each;
- a ceiling no taking back can pass, from the arm without it: each light request's first token had it
  gone into the first batch slot to open on any engine after it arrived, at once (the step after that
  slot opened): what any dispatcher can give without preempting running requests;
- throughput (tokens served per second) and its ratio on / off;
- the largest service gap between backlogged tenants against the bound the scheduler states;
- requests taken back; ``ran_twice``: requests an engine started more than once (a preempted request
  resumes without a new start; one taken back never started): must be 0; ``books_balanced``: every
  counter equals weighted service plus lifts once all has settled (nothing charged twice).
"""

from __future__ import annotations

import bisect
import random
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fairgate.core.registry import Param
from fairgate.loadgen.benches.base import Bench, Figures, Options, numbers, register
from fairgate.loadgen.metrics import quantile
from fairgate.loadgen.simulator import Simulation, SimulationConfig
from fairgate.loadgen.workload import TraceRequest, Workload
from fairgate.loadgen.workloads import Phase, TenantSpec, generate
from fairgate.workers.engines.interface import StepReport
from fairgate.workers.engines.simulated import SimulatedEngine

LIGHT = "light"
FLOOD = "flood"


@dataclass(frozen=True)
class RevokeBenchConfig:
    """The run's shape: ``duration_s`` of traffic per seed, then every admitted request drains."""

    seeds: tuple[int, ...] = (1, 2, 3, 4, 5)
    duration_s: float = 600.0
    replicas: int = 2
    max_running: int = 16  # the engines' batch limit: their queues fill with unstarted requests
    kv_tokens: int = 20_000
    flood_clients: int = 96  # closed loops: three times what the engines' batches hold
    light_rate: float = 0.5  # requests/s


def revoke_workload(config: RevokeBenchConfig, seed: int) -> Workload:
    """The light tenant's Poisson arrivals, and the flood's clients all sending at the start (each
    request's sizes drawn once: its client repeats it)."""
    d = config.duration_s
    light = TenantSpec(LIGHT, (Phase(0.0, d, config.light_rate, arrival="poisson"),), (64, 128), (32, 64))
    workload = generate("revoke", d, [light], seed)
    rng = random.Random(seed)
    flood = [TraceRequest(FLOOD, 0.0, rng.randint(128, 512), rng.randint(16, 64)) for _ in range(config.flood_clients)]
    workload.requests = sorted([*flood, *workload.requests], key=lambda r: (r.arrival_s, r.tenant))
    workload.weights[FLOOD] = 1.0
    workload.outstanding[FLOOD] = config.flood_clients
    return workload


def run_arm(config: RevokeBenchConfig, seed: int, revoke: bool) -> dict[str, Any]:
    """One seed, one arm: the light tenant's first-token times, throughput, the gap and the books."""
    workload = revoke_workload(config, seed)
    sim_config = SimulationConfig(
        replicas=config.replicas,
        max_running=config.max_running,
        kv_tokens=config.kv_tokens,
        revoke=revoke,
        seed=seed,
        drain=True,
    )
    sim = Simulation(workload, sim_config)
    starts = count_starts(sim)
    slots = [_record_slots(engine, sim, config.max_running) for engine in sim.engines]
    report = sim.run().report
    sched, rec = sim.scheduler, sim.recorder
    light = rec.index[LIGHT]
    ttfts = sorted(
        r.first_token_s - r.arrival_s
        for r in rec.requests.values()
        if r.tenant == light and r.first_token_s is not None
    )
    arrivals = [r.arrival_s for r in rec.requests.values() if r.tenant == light]
    ceiling = sorted(t for t in (_first_slot(a, slots) for a in arrivals) if t is not None)
    balanced = all(
        abs(t.counter - (t.service / t.weight + t.lifted)) <= 1e-6 * max(1.0, t.counter) for t in sched.tenants.values()
    )
    return {
        "light_ttft_p50_s": quantile(ttfts, 0.5),
        "light_ttft_p99_s": quantile(ttfts, 0.99),
        "light_ttft_mean_s": statistics.fmean(ttfts) if ttfts else None,
        "light_requests": len(ttfts),
        "ceiling_ttft_p50_s": quantile(ceiling, 0.5),
        "ceiling_ttft_p99_s": quantile(ceiling, 0.99),
        "throughput_tokens_per_s": report["throughput_tokens_per_s"],
        "max_gap": report["max_abs_service_diff"],
        "bound": report["bound_2u"],
        "bound_held": report["bound_held"],
        "revoked": sum(t.revoked for t in sched.tenants.values()),
        "ran_twice": sum(1 for n in starts.values() if n > 1),
        "books_balanced": balanced and not sched.in_flight() and not sched.queue_depth(),
    }


def _record_slots(engine: SimulatedEngine, sim: Simulation, max_running: int) -> list[tuple[float, int]]:
    """(end time, batch slots free after it) of each of ``engine``'s steps, as the simulator ends them."""
    steps: list[tuple[float, int]] = []
    end_step = engine.end_step

    def recorded() -> StepReport:
        report = end_step()
        steps.append((sim.now, max_running - report.running))
        return report

    engine.end_step = recorded  # type: ignore[method-assign]
    return steps


def _first_slot(arrival: float, engines: Sequence[list[tuple[float, int]]]) -> float | None:
    """The first token of a request arriving at ``arrival`` that takes the first batch slot to open on
    any engine: admitted in the step that begins when that slot's step ends, its token at that step's
    end (engines busy step after step)."""
    best = None
    for steps in engines:
        i = bisect.bisect_left(steps, (arrival, -1))
        while i + 1 < len(steps) and steps[i][1] <= 0:
            i += 1
        if i + 1 < len(steps):
            ttft = steps[i + 1][0] - arrival
            best = ttft if best is None or ttft < best else best
    return best


def count_starts(sim: Simulation) -> Counter[str]:
    """Every start an engine reports, per request (the bench's own instrument around the recorder,
    which the simulator hands each step's starts)."""
    starts: Counter[str] = Counter()
    on_step = sim.recorder.on_step

    def counted(now: float, started: Mapping[str, int], *args: Any, **kwargs: Any) -> None:
        starts.update(started.keys())
        on_step(now, started, *args, **kwargs)

    sim.recorder.on_step = counted  # type: ignore[method-assign]
    return starts


def bench_revoke(config: RevokeBenchConfig | None = None) -> dict[str, Any]:
    """Both arms on each seed's workload; per arm the medians over seeds, and the ratios."""
    config = config or RevokeBenchConfig()
    runs = {arm: [run_arm(config, seed, arm == "revoke") for seed in config.seeds] for arm in ("off", "revoke")}
    arms = {arm: _medians(rows) for arm, rows in runs.items()}
    off, on = arms["off"], arms["revoke"]
    return {
        "config": config.__dict__ | {"seeds": list(config.seeds)},
        "arms": arms,
        "per_seed": runs,
        "light_p99_ttft_ratio": _ratio(off["light_ttft_p99_s"], on["light_ttft_p99_s"]),
        "light_p50_ttft_ratio": _ratio(off["light_ttft_p50_s"], on["light_ttft_p50_s"]),
        "light_mean_ttft_ratio": _ratio(off["light_ttft_mean_s"], on["light_ttft_mean_s"]),
        "ceiling_p50_ttft_ratio": _ratio(off["light_ttft_p50_s"], off["ceiling_ttft_p50_s"]),
        "ceiling_p99_ttft_ratio": _ratio(off["light_ttft_p99_s"], off["ceiling_ttft_p99_s"]),
        "throughput_ratio": _ratio(on["throughput_tokens_per_s"], off["throughput_tokens_per_s"]),
        "ran_twice": sum(r["ran_twice"] for rows in runs.values() for r in rows),
        "books_balanced": all(r["books_balanced"] for rows in runs.values() for r in rows),
        "bound_held": all(r["bound_held"] for rows in runs.values() for r in rows),
    }


def _medians(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in rows[0]:
        values = [r[key] for r in rows if r[key] is not None]
        if values and all(isinstance(v, bool) for v in values):
            out[key] = all(values)
        elif values:
            out[key] = statistics.median(values)
        else:
            out[key] = None
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def format_revoke(result: Mapping[str, Any]) -> str:
    c = result["config"]
    lines = [
        f"{c['replicas']} simulated A10G engines, batch {c['max_running']}, KV {c['kv_tokens']} tokens; "
        f"flood {c['flood_clients']} closed loops, light {c['light_rate']:g} req/s; {c['duration_s']:g} s x "
        f"{len(c['seeds'])} seeds (medians)",
        f"{'arm':<7} {'light p50 s':>11} {'p99 s':>7} {'mean s':>7} {'tokens/s':>9} {'max gap':>8} "
        f"{'bound':>9} {'revoked':>8}",
    ]
    for arm, r in result["arms"].items():
        lines.append(
            f"{arm:<7} {r['light_ttft_p50_s']:>11.3f} {r['light_ttft_p99_s']:>7.3f} {r['light_ttft_mean_s']:>7.3f} "
            f"{r['throughput_tokens_per_s']:>9.0f} {r['max_gap']:>8.0f} {r['bound']:>9.0f} {r['revoked']:>8.0f}"
        )
    lines.append(
        f"light tenant's first token, off / revoke: p50 {result['light_p50_ttft_ratio']:.2f}x, "
        f"p99 {result['light_p99_ttft_ratio']:.2f}x, mean {result['light_mean_ttft_ratio']:.2f}x; "
        f"throughput revoke / off {result['throughput_ratio']:.3f}"
    )
    off = result["arms"]["off"]
    lines.append(
        f"ceiling (each light request into the first batch slot to open, at once): p50 "
        f"{off['ceiling_ttft_p50_s']:.3f} s, p99 {off['ceiling_ttft_p99_s']:.3f} s; "
        f"off / ceiling: p50 {result['ceiling_p50_ttft_ratio']:.2f}x, p99 {result['ceiling_p99_ttft_ratio']:.2f}x"
    )
    lines.append(
        f"requests started twice: {result['ran_twice']}; books balanced: {result['books_balanced']}; "
        f"bound held: {result['bound_held']}"
    )
    return "\n".join(lines)


@register
class RevokeBench(Bench):
    """Revocation by over-service against none, engines' batches and queues full of one tenant's requests."""

    name = "revoke"
    help = "revocation by over-service against none, on full engines (simulated)"
    params = (
        Param("seconds", float, 600.0, "simulated seconds of traffic per seed"),
        Param("seeds", str, "1,2,3,4,5", "comma-separated workload seeds (both arms on each)"),
        Param("max_running", int, 16, "the engines' batch limit (large: KV-bound engines)"),
        Param("kv_tokens", int, 20_000, "each engine's KV pool, in tokens"),
    )

    def check(self, options: Options) -> None:
        numbers(options["seeds"], "--seeds")
        if options["seconds"] <= 0 or options["max_running"] < 1 or options["kv_tokens"] < 1024:
            raise ValueError("--seconds and --max-running must be positive, --kv-tokens at least 1024")

    def run(self, options: Options) -> Figures:
        seeds = numbers(options["seeds"], "--seeds")
        config = RevokeBenchConfig(
            seeds=seeds,
            duration_s=options["seconds"],
            max_running=options["max_running"],
            kv_tokens=options["kv_tokens"],
        )
        return bench_revoke(config)

    def report(self, figures: Figures) -> str:
        return format_revoke(figures)
