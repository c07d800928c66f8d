"""``fairgate bench scale``: the dispatcher as deployed, against fleets of 8 to 1,024 workers.

The dispatcher is the gateway's own actor (``DispatcherActor``, in a local Ray cluster): submits reach
it over the real admission frames, as an ingress replica sends them, and the workers report over their
real gRPC streams. The workers are the real worker code over simulated engines of the H200 step-time
preset, many to a process (``fairgate.loadgen.fleet_host``). This process is the ingress: it submits
requests at a set rate (arrivals a Poisson process over 100 tenants), and runs each placed request on
its worker over the data plane, as the ingress does.

Per fleet size the rate ramps (times ``--ramp`` per step) until the p99 admission latency (submit to
placement, as the ingress sees it) passes ``--p99-ms`` or fewer than 95% of the requests offered are
placed in time; the sustained rate is the last step that held. Per step: the dispatcher process's CPU
(read from /proc), divided by the requests it dispatched and by the worker messages it received, and
those messages per second. On a machine of few cores the rate is bounded by the whole fleet sharing
them; the dispatcher's CPU per request is the figure that carries to a big host (docs/speed.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairgate.common.loopback import ray_environment
from fairgate.core.registry import Param
from fairgate.loadgen.benches.base import Bench, Figures, Options, numbers, register
from fairgate.loadgen.fleet_host import FleetSpec
from fairgate.loadgen.metrics import quantile

MODEL = "fairgate-sim"
WARM_UP_S = 5.0
TENANTS = 100
PROMPT_TOKENS = 64
MAX_TOKENS = 8
KV_TOKENS = 200_000
MAX_RUNNING = 64
STEP_MODEL = "h200-llama3-8b"
PLACED_SHARE = 0.95  # of the requests offered in a step, placed within it, for the step to hold


@dataclass(frozen=True)
class Dispatcher:
    """The dispatcher actor under test, and what the ingress needs to reach it."""

    actor: Any
    pid: int
    admission: str
    pool: str
    secret: str
    keys: dict[str, str]  # tenant -> key hash, as the ingress sends it


@dataclass
class StepResult:
    offered_per_s: float
    placed: int
    offered: int
    errors: int
    p99_admission_ms: float
    p50_admission_ms: float
    cpu_s: float
    dispatched: int
    worker_messages: int
    seconds: float
    shard_cpu_ms_per_request: list[float]  # each shard's (one without shards)
    runner_cpu_ms_per_request: float = 0.0  # the shards' rounds' runner's, per request of the fleet

    def holds(self, p99_ms: float) -> bool:
        return self.errors == 0 and self.placed >= PLACED_SHARE * self.offered and self.p99_admission_ms <= p99_ms

    def figures(self) -> dict[str, Any]:
        return {
            "offered_requests_per_s": self.offered_per_s,
            "placed_requests_per_s": self.placed / self.seconds,
            "errors": self.errors,
            "p50_admission_ms": self.p50_admission_ms,
            "p99_admission_ms": self.p99_admission_ms,
            "dispatcher_cpu_ms_per_request": 1000 * self.cpu_s / max(1, self.dispatched),
            "dispatcher_cpu_ms_per_message": 1000 * self.cpu_s / max(1, self.worker_messages),
            "dispatcher_cpu_share": self.cpu_s / self.seconds,
            "report_messages_per_s": self.worker_messages / self.seconds,
            "shard_cpu_ms_per_request": self.shard_cpu_ms_per_request,
            "runner_cpu_ms_per_request": self.runner_cpu_ms_per_request,
        }


def start_dispatchers(app: str, shards: int = 1, tau_s: float = 0.05) -> list[Dispatcher]:
    """The dispatcher's actors (``shards`` of them, and their rounds' runner when several) as a gateway
    creates them, for a configuration of ``TENANTS`` tenants."""
    import ray

    from fairgate.common.key_hashing import KeyHasher
    from fairgate.dispatcher.actor import get_or_create_dispatchers
    from fairgate.gateway.config import deployable, parse_config

    secret = secrets.token_hex(16)
    api_keys = {f"t{i}": "fg-scale-" + secrets.token_hex(12) for i in range(TENANTS)}
    raw = {
        "model": MODEL,
        "tenants": [{"name": t, "api_key": k} for t, k in api_keys.items()],
        "limits": {"max_queued_per_tenant": 100_000, "max_queued": 1_000_000},
        "workers": {"count": 1, "engine": "simulated", "kv_tokens": KV_TOKENS},
        "shards": {"count": shards, "tau_s": tau_s},
    }
    config, _ = parse_config(raw, "bench scale")
    actors = get_or_create_dispatchers(app, deployable(config, secret), secret)
    hasher = KeyHasher.from_environment(secret)
    keys = {t: hasher.of_key(k) for t, k in api_keys.items()}
    return [
        Dispatcher(
            actor,
            ray.get(actor.process.remote())["pid"],
            ray.get(actor.admission_address.remote()),
            ray.get(actor.address.remote()),
            secret,
            keys,
        )
        for actor in actors
    ]


def runner_pid(app: str) -> int | None:
    """The process of the shards' rounds' runner (None without shards)."""
    import ray

    from fairgate.dispatcher.names import rounds_name

    try:
        runner = ray.get_actor(rounds_name(app), namespace="fairgate")
    except ValueError:
        return None
    return ray.get(runner.process.remote())["pid"]


@contextlib.contextmanager
def fleet(ds: list[Dispatcher], workers: int, hosts: int) -> Iterator[None]:
    """``workers`` workers spread over ``hosts`` processes (at least one per shard), each host's workers
    attached to one shard in turn, until the block ends."""
    import ray

    hosts = max(hosts, len(ds))
    per_host = math.ceil(workers / hosts)
    procs: list[subprocess.Popen[str]] = []
    try:
        for host, first in enumerate(range(0, workers, per_host)):
            count = min(per_host, workers - first)
            d = ds[host % len(ds)]
            spec = FleetSpec(d.pool, d.secret, first, count, KV_TOKENS, MAX_RUNNING, STEP_MODEL)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "fairgate.loadgen.fleet_host", spec.to_json()],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for proc in procs:
            if proc.stdout is None or proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a fleet host did not start")
        deadline = time.monotonic() + 120
        while sum(len(ray.get(d.actor.stats.remote())["workers"]) for d in ds) < workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the dispatcher did not see {workers} workers within 120 s")
            time.sleep(0.2)
        yield
    finally:
        for proc in procs:
            with contextlib.suppress(BrokenPipeError, OSError):
                proc.stdin.close()  # type: ignore[union-attr]
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def offer(ds: list[Dispatcher], rate: float, seconds: float, seed: int) -> tuple[list[float], int, int, int]:
    """Requests arriving at ``rate`` per second for ``seconds``, each submitted as the ingress does and
    run on its worker; (admission seconds of each placement in time, requests placed in time, requests
    offered, errors). A request
    taken back unstarted for a less served tenant (revocation) is asked again, as the ingress does.
    With shards, the requests reach them in turn (as from as many ingress replicas), and follow their
    redirects."""
    from fairgate.common.rpc import fairgate_pb2 as pb
    from fairgate.core.reasons import FINISH_REVOKED
    from fairgate.ingress.admission_client import AdmissionClient
    from fairgate.ingress.deployment import MAX_REVOCATIONS
    from fairgate.ingress.generation import Outcome, WorkerConnections, WorkerLost, stream_bytes
    from fairgate.ingress.shard_admission import ShardedAdmission

    d = ds[0]

    def client(address: str) -> AdmissionClient:
        async def where() -> str:
            return address

        return AdmissionClient(where, d.secret, wait_s=10.0, abandoned=lambda _: None)

    clients = [client(s.admission) for s in ds]
    admissions = [ShardedAdmission(clients, home) for home in range(len(ds))]
    connections = WorkerConnections(d.secret.encode())
    body = json.dumps(
        {"model": MODEL, "prompt": "word " * PROMPT_TOKENS, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    ).encode()
    rng = random.Random(seed)
    tenants = list(d.keys)
    waits: list[float] = []
    errors = placed_in_time = 0
    end = time.monotonic() + seconds

    async def one(i: int) -> None:
        nonlocal errors, placed_in_time
        tenant = rng.choice(tenants)
        request = pb.SubmitRequest(
            request_id=f"s{seed}-{i}",
            tenant=tenant,
            prompt_tokens=PROMPT_TOKENS,
            max_tokens=MAX_TOKENS,
            key_hash=d.keys[tenant],
            model=MODEL,
        )
        try:
            for attempt in range(MAX_REVOCATIONS + 1):
                t0 = time.monotonic()
                reply = await admissions[i % len(admissions)].submit(request)
                if reply.rejected:
                    raise RuntimeError(reply.rejected)
                placed = time.monotonic()
                if placed <= end:  # each placement, a request taken back and asked again included
                    waits.append(placed - t0)
                    placed_in_time += attempt == 0
                generate = pb.GenerateRequest(
                    ticket=reply.ticket,
                    endpoint="completions",
                    body=body,
                    prompt_tokens=PROMPT_TOKENS,
                    max_tokens=MAX_TOKENS,
                    choices=1,
                )
                outcome = Outcome()
                try:
                    async for _ in stream_bytes(connections, reply.address, generate, outcome):
                        pass
                    break
                except WorkerLost as exc:  # taken back unstarted (revocation): asked again, as the ingress does
                    if exc.code != FINISH_REVOKED or outcome.received or attempt == MAX_REVOCATIONS:
                        raise
                    request.retry = True
        except Exception:
            errors += 1

    tasks: list[asyncio.Task[None]] = []
    offered, due = 0, time.monotonic()
    while due < end:
        due += rng.expovariate(rate)
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(offered)))
        offered += 1
    await asyncio.gather(*tasks)
    await admissions[0].close()
    await connections.close()
    return waits, placed_in_time, offered, errors


def _cpu_s(pid: int | None) -> float:
    import psutil

    if pid is None:
        return 0.0
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def step(ds: list[Dispatcher], rate: float, seconds: float, seed: int, runner: int | None = None) -> StepResult:
    """One step of the ramp; ``runner``: the shards' rounds' runner's process, whose CPU is counted apart."""
    import ray

    def counters() -> list[dict[str, int]]:
        return [c[MODEL] for c in ray.get([d.actor.load_counters.remote() for d in ds])]

    before, cpu0, run0, t0 = counters(), [_cpu_s(d.pid) for d in ds], _cpu_s(runner), time.monotonic()
    waits, placed, offered, errors = asyncio.run(offer(ds, rate, seconds, seed))
    after, cpu1, run1 = counters(), [_cpu_s(d.pid) for d in ds], _cpu_s(runner)
    elapsed = time.monotonic() - t0
    ms = sorted(1000 * w for w in waits) or [math.inf]
    dispatched = [a["dispatched"] - b["dispatched"] for a, b in zip(after, before, strict=True)]
    cpu = [c1 - c0 for c1, c0 in zip(cpu1, cpu0, strict=True)]
    return StepResult(
        offered_per_s=rate,
        placed=placed,
        offered=offered,
        errors=errors,
        p99_admission_ms=quantile(ms, 0.99),
        p50_admission_ms=quantile(ms, 0.5),
        cpu_s=sum(cpu),
        dispatched=sum(dispatched),
        worker_messages=sum(a["worker_messages"] - b["worker_messages"] for a, b in zip(after, before, strict=True)),
        seconds=elapsed,
        shard_cpu_ms_per_request=[1000 * c / max(1, n) for c, n in zip(cpu, dispatched, strict=True)],
        runner_cpu_ms_per_request=1000 * (run1 - run0) / max(1, sum(dispatched)),
    )


def scale_row(workers: int, options: Options, shards: int = 1) -> dict[str, Any]:
    """One fleet size: its dispatcher (``shards`` of them), its fleet, and the ramp. The CPU per request
    is read at the first rate, which shards are offered ``shards`` times over: each is then offered what
    one dispatcher is, and the difference is what sharding costs (the rounds), not a lower rate's fixed
    costs spread thinner. The ramp for the sustained rate starts from the first rate in all."""
    import ray

    from fairgate.dispatcher.names import rounds_name

    app = f"scale-{workers}-{shards}"
    ds = start_dispatchers(app, shards, options["tau_ms"] / 1000)
    runner = runner_pid(app)
    try:
        with fleet(ds, workers, options["hosts"]):
            # warm-up: connections, caches, and the heap refrozen once the fleet has settled (HeapFreeze)
            step(ds, options["start_rate"] * shards, WARM_UP_S, seed=0, runner=runner)
            steps: list[StepResult] = []
            reference = None  # one dispatcher's: the ramp's first step
            if shards > 1:
                reference = step(ds, options["start_rate"] * shards, options["seconds"], seed=99, runner=runner)
            rate = options["start_rate"]
            while rate <= options["max_rate"]:
                result = step(ds, rate, options["seconds"], seed=len(steps) + 1, runner=runner)
                steps.append(result)
                if not result.holds(options["p99_ms"]):
                    break
                rate *= options["ramp"]
            # the durable state's write cost under load: a base, and one second's journal change
            cost = ds[0].actor.snapshot_cost.remote(1.0)
            step(ds, options["start_rate"] * shards, 3.0, seed=len(steps) + 1, runner=runner)
            snapshot = ray.get(cost)
    finally:
        for d in ds:
            ray.kill(d.actor)
        if runner is not None:
            ray.kill(ray.get_actor(rounds_name(app), namespace="fairgate"))
    held = [s for s in steps if s.holds(options["p99_ms"])]
    best = held[-1] if held else None
    figures = (reference or steps[0]).figures()
    return {
        "workers": workers,
        "shards": shards,
        "shard_cpu_ms_per_request": figures["shard_cpu_ms_per_request"],
        "runner_cpu_ms_per_request": figures["runner_cpu_ms_per_request"],
        "sustained_requests_per_s": best.placed / best.seconds if best else 0.0,
        "p99_admission_ms": best.p99_admission_ms if best else steps[0].p99_admission_ms,
        "dispatcher_cpu_ms_per_request": figures["dispatcher_cpu_ms_per_request"],
        "dispatcher_cpu_ms_per_message": figures["dispatcher_cpu_ms_per_message"],
        "report_messages_per_s": (best or steps[0]).figures()["report_messages_per_s"],
        "snapshot_ms": 1000 * snapshot["base_seconds"],
        "snapshot_bytes": int(snapshot["base_bytes"]),
        "journal_ms_per_s": 1000 * snapshot["seconds"],
        "journal_bytes_per_s": int(snapshot["bytes"]),
        "steps": [s.figures() for s in steps],
    }


@register
class ScaleBench(Bench):
    """The dispatcher's rate and CPU per request as the fleet grows from 8 to 1,024 workers."""

    name = "scale"
    help = "the dispatcher as deployed against fleets of N workers: sustained rate, CPU per request"
    params = (
        Param("workers", str, "8,64,256,1024", "fleet sizes, comma-separated"),
        Param("seconds", float, 5.0, "seconds per rate step"),
        Param("start_rate", float, 200.0, "requests/s of the first step (every fleet size runs it)"),
        Param("ramp", float, 1.5, "each step's rate over the last's"),
        Param("max_rate", float, 50_000.0, "the ramp stops past this rate"),
        Param("p99_ms", float, 5.0, "the p99 admission latency a step must hold"),
        Param("hosts", int, 2, "processes the fleet's workers are spread over"),
        Param("shards", int, 1, "the sharded arm's dispatcher shards, each offered one's rates (1: no such arm)"),
        Param("tau_ms", float, 50.0, "the sharded arm's milliseconds between the shards' rounds"),
        Param("plot", str, "", "write a PNG of the figures per fleet size here"),
    )

    def check(self, options: Options) -> None:
        numbers(options["workers"], "--workers")
        if options["seconds"] <= 0 or options["start_rate"] <= 0 or options["ramp"] <= 1 or options["hosts"] < 1:
            raise ValueError("--seconds and --start-rate must be positive, --ramp above 1, --hosts at least 1")
        if not 1 <= options["shards"] <= 16 or options["tau_ms"] <= 0:
            raise ValueError("--shards must be between 1 and 16, --tau-ms positive")

    def run(self, options: Options) -> Figures:
        ray_environment()  # before anything imports Ray: it reads these at import time
        from fairgate.gateway.app import start_local_ray

        start_local_ray()
        rows, sharded = [], []
        for n in numbers(options["workers"], "--workers"):  # the arms side by side, per fleet size
            rows.append(scale_row(n, options))
            if options["shards"] > 1:
                sharded.append(scale_row(n, options, options["shards"]))
        smallest = min(rows, key=lambda r: r["workers"])
        largest = max(rows, key=lambda r: r["workers"])
        if options["plot"]:
            from fairgate.loadgen.plots import plot_scale

            plot_scale(Path(options["plot"]), sorted(rows, key=lambda r: r["workers"]), options["start_rate"])
        figures: Figures = {
            "rows": rows,
            "cpu_per_request_ratio": largest["dispatcher_cpu_ms_per_request"]
            / smallest["dispatcher_cpu_ms_per_request"],
            "reference_rate": options["start_rate"],
        }
        if sharded:
            figures["sharded_rows"] = sharded
            figures["shard_cpu_ratio"] = {  # each shard's CPU per request over the single dispatcher's
                str(one["workers"]): max(s["shard_cpu_ms_per_request"]) / one["dispatcher_cpu_ms_per_request"]
                for one, s in zip(rows, sharded, strict=True)
            }
        return figures

    def report(self, figures: Figures) -> str:
        lines = [
            "| workers | sustained requests/s (p99 admission) | dispatcher CPU ms/request | ms/message "
            "| report messages/s | whole state ms (KB) | journal per second ms (KB) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in figures["rows"]:
            lines.append(
                f"| {r['workers']:,} | {r['sustained_requests_per_s']:,.0f} ({r['p99_admission_ms']:.1f} ms) "
                f"| {r['dispatcher_cpu_ms_per_request']:.3f} | {r['dispatcher_cpu_ms_per_message']:.3f} "
                f"| {r['report_messages_per_s']:,.0f} | {r['snapshot_ms']:.1f} ({r['snapshot_bytes'] / 1000:,.0f}) "
                f"| {r['journal_ms_per_s']:.1f} ({r['journal_bytes_per_s'] / 1000:,.1f}) |"
            )
        lines.append(
            f"CPU per request at {figures['reference_rate']:,.0f} requests/s, largest fleet over smallest: "
            f"{figures['cpu_per_request_ratio']:.2f}x"
        )
        for r in figures.get("sharded_rows", []):
            per_shard = " / ".join(f"{ms:.3f}" for ms in r["shard_cpu_ms_per_request"])
            lines.append(
                f"{r['shards']} shards, {r['workers']:,} workers: each shard's CPU ms/request {per_shard} "
                f"({figures['shard_cpu_ratio'][str(r['workers'])]:.2f}x the single dispatcher's at the most), "
                f"the runner's {r['runner_cpu_ms_per_request']:.3f}; the shards together sustained "
                f"{r['sustained_requests_per_s']:,.0f} requests/s ({r['p99_admission_ms']:.1f} ms p99)"
            )
        return "\n".join(lines)
