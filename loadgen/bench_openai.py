"""``fairgate bench openai``: the gateway against its engine's own OpenAI server, same engine, one run.

The same real client (streaming chat with usage, closed loops) is driven at the engine served alone,
then through the whole gateway (HTTP -> front door -> ingress -> dispatcher -> worker, whose engine
layer writes the bytes the ingress relays) to one worker with the same settings. For vLLM the engine
served alone is the engine plug-in's reference server: vLLM's own OpenAI server, or the simulated
engine's own layer under uvicorn (``workers.engine_server``). A third arm, the floor, serves the same
engine layer in one bare Ray Serve replica behind the same front door, nothing of fairgate around it
(``workers.engine_on_serve``): what Serve's request path costs before the gateway does anything.
Each arm runs alone on the machine. Figures per arm:
output tokens/s and first-token latency (median, p99) at ``concurrency`` streams, first-token latency
at light load (one stream), and short requests/s (one output token each, not streamed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from workers.engines import engine_for

PROMPT = "Tell me about the tenants that share this cluster and how the queue serves them."


@dataclass
class OpenAIBenchConfig:
    engine: str = "simulated"
    settings: dict[str, Any] = field(default_factory=dict)  # the engine's settings (the config's workers section)
    model: str = "fairgate-sim"
    concurrency: int = 24
    requests: int = 240  # streamed requests per arm
    max_tokens: int = 64
    light_requests: int = 30
    short_concurrency: int = 16
    short_requests: int = 400


@dataclass
class ArmResult:
    output_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    light_ttft_p50_ms: float
    short_requests_per_s: float
    errors: int


# ----------------------------------------------------------------------------- the client


async def _stream_one(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[float, int]:
    """(seconds to the first content, output tokens) of one streamed chat completion."""
    t0 = time.perf_counter()
    first = 0.0
    tokens = 0
    async with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if not first and any(c.get("delta", {}).get("content") for c in event.get("choices", ())):
                first = time.perf_counter() - t0
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
    return first, tokens


async def _closed_loops(n: int, total: int, one) -> tuple[list[Any], int, float]:
    """``total`` calls of ``one()`` from ``n`` closed loops; (results, errors, seconds)."""
    results: list[Any] = []
    errors = 0
    left = total

    async def loop() -> None:
        nonlocal left, errors
        while left > 0:
            left -= 1
            try:
                results.append(await one())
            except (httpx.HTTPError, ValueError):
                errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(n)))
    return results, errors, time.perf_counter() - t0


async def measure(base_url: str, api_key: str, config: OpenAIBenchConfig) -> ArmResult:
    headers = {"Authorization": f"Bearer {api_key}"}
    limits = httpx.Limits(max_connections=max(config.concurrency, config.short_concurrency) + 4)
    chat = {
        "model": config.model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": config.max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    short = {"model": config.model, "prompt": "hello", "max_tokens": 1, "ignore_eos": True}
    url = base_url + "/chat/completions"
    async with httpx.AsyncClient(timeout=300, headers=headers, limits=limits) as client:
        await _closed_loops(4, 8, lambda: _stream_one(client, url, chat))  # warm up both ways
        light, light_errors, _ = await _closed_loops(1, config.light_requests, lambda: _stream_one(client, url, chat))
        loaded, errors, seconds = await _closed_loops(
            config.concurrency, config.requests, lambda: _stream_one(client, url, chat)
        )

        async def one_short() -> int:
            r = await client.post(base_url + "/completions", json=short)
            r.raise_for_status()
            return 1

        done, short_errors, short_s = await _closed_loops(config.short_concurrency, config.short_requests, one_short)
    ttfts = sorted(t for t, _ in loaded)
    return ArmResult(
        output_tokens_per_s=sum(n for _, n in loaded) / seconds,
        ttft_p50_ms=1000 * statistics.median(ttfts),
        ttft_p99_ms=1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
        light_ttft_p50_ms=1000 * statistics.median(t for t, _ in light),
        short_requests_per_s=len(done) / short_s,
        errors=errors + light_errors + short_errors,
    )


# ----------------------------------------------------------------------------- the two arms


@contextlib.contextmanager
def through_gateway(config: OpenAIBenchConfig, port: int) -> Iterator[tuple[str, str]]:
    """A one-worker gateway on local Ray with the same engine settings; yields (base URL, API key)."""
    import ray
    from ray import serve

    from dispatcher.actor import dispatcher_name
    from gateway.app import run_app, start_local_ray
    from gateway.config import parse_config

    key = "fg-bench-" + secrets.token_hex(12)
    workers = {"count": 1, "engine": config.engine, **config.settings}
    raw = {
        "model": config.model,
        "workers": workers,
        "ingress": {"max_model_len": 1 << 20},
        "limits": {"max_queued_per_tenant": 100_000},
        "tenants": [{"name": "bench", "api_key": key}],
    }
    gateway, _ = parse_config(raw)
    start_local_ray()
    url = run_app("bench-openai", gateway, secrets.token_hex(16), port, route_prefix="/")
    try:
        yield url + "/v1", key
    finally:
        serve.delete("bench-openai")
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(dispatcher_name("bench-openai"), namespace="fairgate"))
        serve.shutdown()


@contextlib.contextmanager
def on_bare_serve(config: OpenAIBenchConfig, port: int) -> Iterator[str]:
    """The engine's layer in one bare Serve replica behind the front door; yields its base URL."""
    from ray import serve

    from gateway.app import start_local_ray
    from workers.engine_on_serve import EngineOnServe

    start_local_ray()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(EngineOnServe.bind(config.engine, config.settings, config.model), name="bench-floor", route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_engine(url + "/v1", config.model)
        yield url + "/v1"
    finally:
        serve.delete("bench-floor")
        serve.shutdown()


def _wait_for_engine(base: str, model: str, timeout_s: float = 300.0) -> None:
    """Until one completion comes back through the front door (its routes and the engine come late)."""
    deadline = time.monotonic() + timeout_s
    body = {"model": model, "prompt": "hello", "max_tokens": 1}
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.post(base + "/completions", json=body, timeout=30).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the engine on Serve at {base} did not answer within {timeout_s:.0f} s")
        time.sleep(0.3)


ARMS = ("alone", "serve_floor", "gateway")


def bench_openai(config: OpenAIBenchConfig, log_dir: Path | None = None, rounds: int = 2) -> dict[str, Any]:
    """The three arms (the engine alone, the floor, the gateway), alternating ``rounds`` times, each
    alone on the machine (a pause between arms lets the previous one's processes go); per arm the
    median of its rounds, and the ratios to the engine alone."""
    runs: dict[str, list[ArmResult]] = {arm: [] for arm in ARMS}
    for i in range(rounds):
        alone_log = log_dir / f"engine-alone-{i}.log" if log_dir is not None else None
        plugin = engine_for(config.engine)
        with plugin.reference_server(plugin.settings(config.settings), config.model, _free_port(), alone_log) as base:
            runs["alone"].append(asyncio.run(measure(base, "none", config)))
        time.sleep(5)
        with on_bare_serve(config, _free_port()) as base:
            runs["serve_floor"].append(asyncio.run(measure(base, "none", config)))
        time.sleep(5)
        with through_gateway(config, _free_port()) as (base, key):
            runs["gateway"].append(asyncio.run(measure(base, key, config)))
        time.sleep(5)
    medians = {arm: _median(r) for arm, r in runs.items()}
    alone = medians["alone"]
    return {
        "config": asdict(config),
        **{arm: asdict(m) for arm, m in medians.items()},
        "rounds": {arm: [asdict(r) for r in arm_runs] for arm, arm_runs in runs.items()},
        "ratio": _ratios(medians["gateway"], alone),
        "floor_ratio": _ratios(medians["serve_floor"], alone),
    }


def _ratios(arm: ArmResult, alone: ArmResult) -> dict[str, float]:
    return {
        "output_tokens_per_s": arm.output_tokens_per_s / alone.output_tokens_per_s,
        "short_requests_per_s": arm.short_requests_per_s / alone.short_requests_per_s,
        "ttft_p50_ms_overhead": arm.ttft_p50_ms - alone.ttft_p50_ms,
        "light_ttft_p50_ms_overhead": arm.light_ttft_p50_ms - alone.light_ttft_p50_ms,
    }


def _median(runs: list[ArmResult]) -> ArmResult:
    """Each figure's median over the rounds; errors are summed (every one counts)."""
    fields = asdict(runs[0])
    medians = {k: statistics.median(asdict(r)[k] for r in runs) for k in fields}
    return ArmResult(**(medians | {"errors": sum(r.errors for r in runs)}))


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
