"""``fairgate bench gateway``: the dispatcher's request rate and the gateway's first-token overhead.

1. Requests per second through the dispatcher: submit -> assign -> the worker's engine (zero step time)
   -> its per-step report over the real gRPC stream -> finish, with many requests in flight. Dispatcher
   and workers share this one process (and so its CPU), which makes the figure conservative.
2. First-token latency through the whole gateway (HTTP -> front door -> ingress -> dispatcher ->
   worker, over the data plane's frames) against sending the same worker a request directly with a
   ticket, one request at a time, the two alternating so both see the same machine.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import statistics
import time
from typing import Any

from fairgate.common.config import TelemetrySettings
from fairgate.common.loopback import ray_environment
from fairgate.common.rpc import fairgate_pb2 as pb
from fairgate.common.tickets import TicketFields, sign, ticket_message
from fairgate.common.tracing import RequestTrace, configure_tracing, extract_context, set_tracing_active, tracer
from fairgate.core import SchedulerConfig
from fairgate.core.registry import Param
from fairgate.dispatcher.metrics import ServiceHistory
from fairgate.dispatcher.service import DispatcherService
from fairgate.ingress.generation import Outcome, WorkerConnections, stream_bytes
from fairgate.ingress.prometheus import render_prometheus
from fairgate.loadgen.benches.base import Bench, Figures, Options, register
from fairgate.workers.engines.interface import GenerationParams
from fairgate.workers.engines.simulated import SimulatedEngine, StepTimeModel
from fairgate.workers.engines.simulated.runner import SimulatedRunner
from fairgate.workers.worker import Worker


async def dispatcher_requests_per_second(
    requests: int, workers: int = 2, in_flight: int = 256, telemetry: bool = False
) -> float:
    """``telemetry``: the dispatcher's own telemetry on: latency histograms, dispatch counts, and its
    snapshot (tenants, workers, gap, 2U, history, Jain) rendered as Prometheus text ten times a second (in
    service: once a second, and per scrape). Spans are made in the ingress and worker processes, not
    here: ``tracing_cost_per_request`` measures them."""
    secret = secrets.token_bytes(16)
    service = DispatcherService(SchedulerConfig(max_engine_waiting=64), secret, observe=telemetry)
    address = await service.start()
    pool = [
        Worker(f"w{i}", address, secret, SimulatedRunner(SimulatedEngine(1 << 40, StepTimeModel.zero())))
        for i in range(workers)
    ]
    for w in pool:
        await w.start()
    while len(service.scheduler.workers) < workers:
        await asyncio.sleep(0.01)
    by_id = {w.worker_id: w for w in pool}
    gate = asyncio.Semaphore(in_flight)
    params = GenerationParams("x " * 8, max_tokens=2, ignore_eos=True)
    finished = 0
    all_done = asyncio.Event()

    async def one(i: int) -> None:
        nonlocal finished
        async with gate:
            rid = f"r{i}"
            placement = await service.submit(rid, f"t{i % 100}", 8, 2)
            async for _ in by_id[placement.worker_id].runner.generate(rid, params):
                pass
            while rid in service.scheduler.in_flight():  # until the dispatcher has seen it finish
                await asyncio.sleep(0.001)
            finished += 1
            if finished == requests:
                all_done.set()

    async def snapshots() -> None:
        history = ServiceHistory()
        while True:
            await asyncio.sleep(0.1)
            render_prometheus(history.record(time.time(), service.telemetry()), 20)

    start = time.perf_counter()
    tasks = [asyncio.create_task(one(i)) for i in range(requests)]
    observer = asyncio.create_task(snapshots()) if telemetry else None
    await all_done.wait()
    elapsed = time.perf_counter() - start
    if observer is not None:
        observer.cancel()
    await asyncio.gather(*tasks)
    for w in pool:
        await w.stop()
    await service.stop()
    return requests / elapsed


def telemetry_overhead(requests: int, rounds: int = 3) -> dict[str, float]:
    """The dispatcher benchmark with its telemetry off and on, alternating ``rounds`` times in one run."""
    off: list[float] = []
    on: list[float] = []
    for _ in range(rounds):
        off.append(asyncio.run(dispatcher_requests_per_second(requests, telemetry=False)))
        on.append(asyncio.run(dispatcher_requests_per_second(requests, telemetry=True)))
    return {"off": statistics.median(off), "on": statistics.median(on)}


def trace_one_request(i: int) -> None:
    """The spans of one request as the ingress and the worker make them (the context goes through the same
    inject/extract as to a worker)."""
    trace = RequestTrace({"fairgate.request_id": f"r{i}", "fairgate.tenant": "t", "fairgate.prompt_tokens": 8})
    with trace.queue_span() as queue:
        trace.dispatched(queue, "w0", 1.0)
    carried = trace.start_generate("w0")
    worker = tracer().start_span("fairgate.worker.generate", context=extract_context(carried))
    trace.first_token()
    worker.set_attribute("fairgate.completion_tokens", 2)
    worker.end()
    trace.finish(8, 2, "length")


def tracing_cost_per_request(requests: int = 20_000) -> dict[str, float]:
    """Microseconds of tracing per request (four spans, exported by a batch processor to memory), with
    tracing off (the API's no-op tracer) and on."""
    configure_tracing(TelemetrySettings(traces="memory"), "fairgate-bench")
    out = {}
    for name, active in (("off", False), ("on", True)):
        set_tracing_active(active)
        start = time.perf_counter()
        for i in range(requests):
            trace_one_request(i)
        out[name] = 1e6 * (time.perf_counter() - start) / requests
    set_tracing_active(True)
    return out


def first_token_overhead(samples: int) -> dict[str, float]:
    """Start a one-worker gateway on local Ray, then time first tokens both ways."""
    import ray
    from ray import serve

    from fairgate.dispatcher.actor import dispatcher_name
    from fairgate.gateway.app import run_app, start_local_ray
    from fairgate.gateway.config import parse_config

    key = "fg-bench-" + secrets.token_hex(12)
    zero = {k: 0.0 for k in StepTimeModel.zero().to_dict()}
    config, _ = parse_config(
        {
            "workers": {"count": 1, "step_model": zero, "block_size": 1},
            "tenants": [{"name": "bench", "api_key": key}],
        }
    )
    secret = secrets.token_hex(16)
    start_local_ray()
    port = _free_port()
    url = run_app("bench", config, secret, port, route_prefix="/bench")
    try:
        actor = ray.get_actor(dispatcher_name("bench"), namespace="fairgate")
        worker = ray.get(actor.stats.remote())["workers"][0]
        gateway_s, direct_s = asyncio.run(_alternate(url, key, config.model, worker, secret.encode(), samples))
        overhead = [g - d for g, d in zip(gateway_s, direct_s, strict=True)]
        return {
            "gateway_p50_ms": 1000 * statistics.median(gateway_s),
            "direct_p50_ms": 1000 * statistics.median(direct_s),
            "overhead_p50_ms": 1000 * statistics.median(overhead),
            "overhead_p90_ms": 1000 * statistics.quantiles(overhead, n=10)[-1],
        }
    finally:
        serve.delete("bench")
        ray.kill(ray.get_actor(dispatcher_name("bench"), namespace="fairgate"))


async def _alternate(
    url: str, key: str, model: str, worker: dict[str, Any], secret: bytes, samples: int
) -> tuple[list[float], list[float]]:
    """First-token seconds through the gateway and directly, alternating; connections reused both ways."""
    import httpx

    body = {"model": model, "prompt": "hello", "max_tokens": 1, "stream": True, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {key}"}
    gateway_s: list[float] = []
    direct_s: list[float] = []
    connections = WorkerConnections(secret)
    async with httpx.AsyncClient(timeout=30) as client:
        for i in range(samples + 5):
            t0 = time.perf_counter()
            async with client.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data:") and '"text": " ' in line:
                        break
            t_gateway = time.perf_counter() - t0
            t_direct = await _direct_first_token(connections, worker, secret, f"direct-{i}")
            if i >= 5:  # the first few warm up connections
                gateway_s.append(t_gateway)
                direct_s.append(t_direct)
    await connections.close()
    return gateway_s, direct_s


async def _direct_first_token(connections: WorkerConnections, worker: dict[str, Any], secret: bytes, rid: str) -> float:
    fields = TicketFields(rid, "bench", worker["id"], time.time() + 30, prompt_tokens=1, max_tokens=1)
    ticket = ticket_message(fields, sign(secret, fields))
    body = {"model": "bench", "prompt": "hello", "max_tokens": 1, "stream": True, "ignore_eos": True}
    request = pb.GenerateRequest(
        ticket=ticket, endpoint="completions", body=json.dumps(body).encode(), prompt_tokens=1, max_tokens=1, choices=1
    )
    t0 = time.perf_counter()
    data = stream_bytes(connections, worker["address"], request, Outcome())
    async for piece in data:
        if b'"text":"' in piece.replace(b": ", b":") and b'"text":""' not in piece.replace(b": ", b":"):
            break
    elapsed = time.perf_counter() - t0
    await data.aclose()  # type: ignore[attr-defined]
    return elapsed


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@register
class GatewayBench(Bench):
    """The dispatcher's request rate with its telemetry off and on, tracing's cost, first-token overhead."""

    name = "gateway"
    help = "requests/s through the dispatcher; first-token overhead"
    params = (
        Param("requests", int, 5000, "requests pushed through the dispatcher"),
        Param("samples", int, 100, "first-token samples each way"),
    )

    def check(self, options: Options) -> None:
        if options["requests"] < 1 or options["samples"] < 2:
            raise ValueError("--requests must be >= 1 and --samples >= 2")

    def run(self, options: Options) -> Figures:
        ray_environment()  # before anything imports Ray: it reads these at import time
        return {
            "requests_per_s": telemetry_overhead(options["requests"]),
            "tracing_us_per_request": tracing_cost_per_request(),
            "first_token": first_token_overhead(options["samples"]),
        }

    def report(self, figures: Figures) -> str:
        rps, spans, ttft = figures["requests_per_s"], figures["tracing_us_per_request"], figures["first_token"]
        return "\n".join(
            [
                f"dispatcher: {rps['off']:,.0f} requests/s with its telemetry off, {rps['on']:,.0f} with it on "
                f"({100 * rps['on'] / rps['off']:.0f}%; medians of 3 alternating rounds; submit -> assign -> "
                "zero-time engine -> report -> finish)",
                f"tracing (ingress and worker processes): {spans['on']:.0f} us per request with spans exported, "
                f"{spans['off']:.1f} us with tracing off",
                f"first token: gateway p50 {ttft['gateway_p50_ms']:.1f} ms, worker Generate directly p50 "
                f"{ttft['direct_p50_ms']:.1f} ms; gateway overhead p50 {ttft['overhead_p50_ms']:.1f} ms, "
                f"p90 {ttft['overhead_p90_ms']:.1f} ms (tracing's share of it: "
                f"{100 * spans['on'] / 1000 / ttft['overhead_p50_ms']:.1f}%)",
            ]
        )
