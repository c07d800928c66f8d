"""``fairgate bench openai``: the gateway against its engine's own OpenAI server, same engine, one run.

The same real client (streaming chat with usage, closed loops; then one stream; then short 1-token
completions) is driven at the engine served alone, and through the whole gateway (HTTP -> front door
-> ingress -> dispatcher -> worker, whose engine layer writes the bytes the ingress relays) to one
worker with the same settings, once per front door asked for. The engine served alone is the engine
plug-in's reference server: vLLM's own OpenAI server, or the simulated engine's own layer under
uvicorn (``fairgate.workers.engine_server``). Each gateway arm is ``fairgate serve`` as users start it, in a
process (and Ray cluster) of its own, up beside the engine alone. The arms are measured in turn, the
other one paused (``fairgate.loadgen.pausing``), so each pass has the machine to itself and a round's passes
are seconds apart. Each phase uses a client of its own (its connection pool sized for it). Figures per
arm: output tokens/s and first-token latency (median, p99) at ``concurrency`` streams, first-token
latency at light load (one stream), and short requests/s (one output token each, not streamed,
``short_concurrency`` at once).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import secrets
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from fairgate.common.loopback import FRONT_DOORS
from fairgate.core.registry import Param
from fairgate.loadgen.benches.base import Bench, Figures, Options, names, register
from fairgate.loadgen.cpu_split import MACHINE_CPUS, busy_share, cpu_times, parse_cpus, split_cpus
from fairgate.loadgen.pausing import listening_process, paused
from fairgate.loadgen.serve_process import free_port, served_gateway
from fairgate.workers.engines import engine_for

# After an arm is continued, its timers catch up (Ray's health checks, metrics pushes) before it is measured.
RESUME_SETTLE_S = 2.0

PROMPT = "Tell me about the tenants that share this cluster and how the queue serves them."
FILLER = PROMPT.lower().rstrip(".").split()


@dataclass
class OpenAIBenchConfig:
    engine: str = "simulated"
    settings: dict[str, Any] = field(default_factory=dict)  # the engine's settings (the config's workers section)
    model: str = "fairgate-sim"
    concurrency: int = 24
    requests: int = 480  # streamed requests per arm and round
    max_tokens: int = 64
    prompt_words: int = 0  # 0: one short sentence; else this many words, each request's its own (no shared prefix)
    light_requests: int = 30
    short_concurrency: int = 16
    short_requests: int = 1200  # long enough to be more than its ramp and tail
    engine_cpus: tuple[int, ...] = ()  # none: all share every core; else the engine's processes' cores


@dataclass
class ArmResult:
    output_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    light_ttft_p50_ms: float
    short_requests_per_s: float
    engine_cpu_busy: float  # loaded phase, with --engine-cpus: how busy the engine's cores were (0-1); else 0
    host_cpu_busy: float  # loaded phase: how busy the other cores were (all of them without --engine-cpus)
    errors: int
    error_kinds: dict[str, int] = field(default_factory=dict)  # what the client saw fail, by exception


# ----------------------------------------------------------------------------- the client


async def stream_one(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[float, int]:
    """(seconds to the first content, output tokens) of one streamed chat completion."""
    t0 = time.perf_counter()
    first = 0.0
    tokens = 0
    async with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for data in sse_data(r.aiter_bytes()):
            if data == b"[DONE]":
                continue
            event = json.loads(data)
            if not first and any(c.get("delta", {}).get("content") for c in event.get("choices", ())):
                first = time.perf_counter() - t0
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
    return first, tokens


async def sse_data(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The ``data:`` fields of a server-sent event stream. Lines end at a line feed only: the events'
    JSON carries generated text unescaped, and text-level line splitting (``str.splitlines``, which
    httpx's ``aiter_lines`` follows) also breaks at U+2028, U+0085 and other separators a model may
    generate, cutting an event in two."""
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip()


async def closed_loops(
    n: int, total: int, one, kinds: collections.Counter[str] | None = None
) -> tuple[list[Any], int, float]:
    """``total`` calls of ``one()`` from ``n`` closed loops; (results, errors, seconds). ``kinds``
    counts the errors by what failed (an HTTP status, or the client's exception)."""
    results: list[Any] = []
    errors = 0
    left = total

    async def loop() -> None:
        nonlocal left, errors
        while left > 0:
            left -= 1
            try:
                results.append(await one())
            except (httpx.HTTPError, ValueError) as exc:
                errors += 1
                if kinds is not None:
                    status = exc.response.status_code if isinstance(exc, httpx.HTTPStatusError) else None
                    kinds[f"HTTP {status}" if status else type(exc).__name__] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(n)))
    return results, errors, time.perf_counter() - t0


def _chat(config: OpenAIBenchConfig) -> Callable[[], dict[str, Any]]:
    """The streamed chat request every loaded and light-load pass sends: one short prompt, or with
    ``prompt_words`` a long one that starts with a number of its own, so that no two requests share a
    cached prefix (a KV-bound load)."""
    if not config.prompt_words:
        body = chat_body(config, PROMPT)
        return lambda: body
    counter = itertools.count()
    filler = " ".join(FILLER[i % len(FILLER)] for i in range(config.prompt_words - 1))
    return lambda: chat_body(config, f"{next(counter)} {filler}")


def chat_body(config: OpenAIBenchConfig, prompt: str) -> dict[str, Any]:
    return {
        "model": config.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": config.max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def bench_client(api_key: str, connections: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(timeout=300, headers={"Authorization": f"Bearer {api_key}"}, limits=limits)


async def measure(base_url: str, api_key: str, config: OpenAIBenchConfig) -> ArmResult:
    """One pass of the three phases; the CPUs' busy shares are those of the loaded phase."""
    chat = _chat(config)
    engine_cpus = set(config.engine_cpus)
    short = {"model": config.model, "prompt": "hello", "max_tokens": 1, "ignore_eos": True}
    url = base_url + "/chat/completions"
    kinds: collections.Counter[str] = collections.Counter()
    async with bench_client(api_key, config.concurrency) as c:
        await closed_loops(4, 8, lambda: stream_one(c, url, chat()))  # warm up both ways
        light, light_errors, _ = await closed_loops(1, config.light_requests, lambda: stream_one(c, url, chat()), kinds)
        before = cpu_times()
        loaded, errors, seconds = await closed_loops(
            config.concurrency, config.requests, lambda: stream_one(c, url, chat()), kinds
        )
        after = cpu_times()
    async with bench_client(api_key, config.short_concurrency) as c:

        async def one_short() -> int:
            r = await c.post(base_url + "/completions", json=short)
            r.raise_for_status()
            return 1

        await closed_loops(config.short_concurrency, config.short_concurrency, one_short)  # its connections
        done, short_errors, short_s = await closed_loops(
            config.short_concurrency, config.short_requests, one_short, kinds
        )
    ttfts = sorted(t for t, _ in loaded)
    return ArmResult(
        output_tokens_per_s=sum(n for _, n in loaded) / seconds,
        ttft_p50_ms=1000 * statistics.median(ttfts),
        ttft_p99_ms=1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
        light_ttft_p50_ms=1000 * statistics.median(t for t, _ in light),
        short_requests_per_s=len(done) / short_s,
        engine_cpu_busy=busy_share(before, after, engine_cpus),
        host_cpu_busy=busy_share(before, after, MACHINE_CPUS - engine_cpus),
        errors=errors + light_errors + short_errors,
        error_kinds=dict(kinds),
    )


async def warm_up(base_url: str, api_key: str, config: OpenAIBenchConfig) -> None:
    """One loaded pass, not measured: a server's first loaded pass after it starts is slower."""
    chat, url = _chat(config), base_url + "/chat/completions"
    async with bench_client(api_key, config.concurrency) as c:
        await closed_loops(config.concurrency, config.requests, lambda: stream_one(c, url, chat()))


# ----------------------------------------------------------------------------- the arms


def through_gateway(
    config: OpenAIBenchConfig, port: int, front_door: str, log: Path | None = None
) -> contextlib.AbstractContextManager[tuple[str, str, int]]:
    """``fairgate serve`` behind ``front_door`` with one worker of the same engine settings, in a
    process of its own until the block ends; yields (base URL, API key, its process id)."""
    key = "fg-bench-" + secrets.token_hex(12)
    gateway = {
        "model": config.model,
        "workers": {"count": 1, "engine": config.engine, **config.settings},
        "ingress": {"max_model_len": 1 << 20},
        "limits": {"max_queued_per_tenant": 100_000},
        "tenants": [{"name": "bench", "api_key": key}],
    }
    return served_gateway(gateway, port, key, front_door, log)


def bench_openai(
    config: OpenAIBenchConfig, front_doors: Sequence[str] = ("direct",), log_dir: Path | None = None, rounds: int = 4
) -> dict[str, Any]:
    """The engine alone, up for the whole run, and each front door's gateway started beside it in turn.
    Both warm up first (one loaded pass each, not measured). Then ``rounds`` times, each of the two is
    measured while the other is paused (its whole process tree stopped), alone first in even rounds and
    the gateway first in odd ones. Every pass has the machine to itself, and a round's two passes are
    seconds apart: the machine's own drift (docs/speed.md) falls out of each round's ratio. Per arm
    the median of its rounds; per gateway arm the median of its rounds' ratios. With
    ``config.engine_cpus``, both arms' processes are pinned before each pass (``fairgate.loadgen.cpu_split``)."""
    runs: dict[str, list[ArmResult]] = {arm: [] for arm in ["alone", *front_doors]}
    pinned = (0, 0)
    ratios: dict[str, list[dict[str, float]]] = {door: [] for door in front_doors}
    plugin = engine_for(config.engine)
    pin = _cpu_split(plugin, config.engine_cpus)
    alone_port = free_port()
    alone_log = log_dir / "engine-alone.log" if log_dir is not None else None
    with plugin.reference_server(plugin.settings(config.settings), config.model, alone_port, alone_log) as alone_base:
        alone_pid = listening_process(alone_port)
        if alone_pid is None:
            raise RuntimeError(f"no process listens on the engine's port {alone_port}")
        for door in front_doors:
            log = log_dir / f"gateway-{door}.log" if log_dir is not None else None
            with through_gateway(config, free_port(), door, log) as (base, key, gateway_pid):
                arms = {"alone": (alone_base, "none", gateway_pid), door: (base, key, alone_pid)}
                for url, api_key, other in arms.values():  # both warm (a first loaded pass ran slower)
                    pin(alone_pid, gateway_pid)
                    with paused(other):
                        time.sleep(RESUME_SETTLE_S)
                        asyncio.run(warm_up(url, api_key, config))
                for i in range(rounds):
                    got: dict[str, ArmResult] = {}
                    for arm in ("alone", door) if i % 2 == 0 else (door, "alone"):
                        url, api_key, other = arms[arm]
                        pinned = pin(alone_pid, gateway_pid)  # a process started since (Ray's) gets its side too
                        with paused(other):
                            time.sleep(RESUME_SETTLE_S)
                            got[arm] = asyncio.run(measure(url, api_key, config))
                    runs["alone"].append(got["alone"])
                    runs[door].append(got[door])
                    ratios[door].append(_ratios(got[door], got["alone"]))
    medians = {arm: _median(r) for arm, r in runs.items()}
    return {
        "config": asdict(config),
        "arms": {arm: asdict(m) for arm, m in medians.items()},
        "rounds": {arm: [asdict(r) for r in arm_runs] for arm, arm_runs in runs.items()},
        "ratios": {door: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for door, rs in ratios.items()},
        "round_ratios": ratios,
        "pinned_processes": {"engine": pinned[0], "host": pinned[1]},
    }


def _cpu_split(plugin: Any, engine_cpus: tuple[int, ...]) -> Callable[..., tuple[int, int]]:
    """What pins both arms' processes before each pass (nothing without ``engine_cpus``); it returns
    how many processes went to the engine's cores and to the rest."""
    if not engine_cpus:
        return lambda *roots: (0, 0)
    titles = plugin.engine_process_titles
    if not titles:
        raise ValueError(f"the {plugin.name} engine runs inside its worker: it has no processes of its own to pin")

    def pin(*roots: int) -> tuple[int, int]:
        return split_cpus(roots, titles, set(engine_cpus))

    return pin


def _ratios(arm: ArmResult, alone: ArmResult) -> dict[str, float]:
    return {
        "output_tokens_per_s": arm.output_tokens_per_s / alone.output_tokens_per_s,
        "short_requests_per_s": arm.short_requests_per_s / alone.short_requests_per_s,
        "ttft_p50_ms_overhead": arm.ttft_p50_ms - alone.ttft_p50_ms,
        "light_ttft_p50_ms_overhead": arm.light_ttft_p50_ms - alone.light_ttft_p50_ms,
    }


def _median(runs: list[ArmResult]) -> ArmResult:
    """Each figure's median over the rounds; errors are summed (every one counts)."""
    figures = [k for k, v in asdict(runs[0]).items() if isinstance(v, float)]
    medians = {k: statistics.median(getattr(r, k) for r in runs) for k in figures}
    kinds: collections.Counter[str] = collections.Counter()
    for r in runs:
        kinds.update(r.error_kinds)
    return ArmResult(**medians, errors=sum(r.errors for r in runs), error_kinds=dict(kinds))


@register
class OpenAIBench(Bench):
    """The gateway against its engine's own OpenAI server, side by side, the other arm paused."""

    name = "openai"
    help = "the gateway against its engine's own OpenAI server, side by side"
    params = (
        Param("engine", str, "simulated", "the engine plug-in"),
        Param("model", str, "", "vLLM model (default tiny); the simulated engine: fairgate-sim"),
        Param("kv_tokens", int, 0, "KV pool (0: vLLM 8192, simulated 1,000,000)"),
        Param("max_num_seqs", int, 64, "vLLM's batch limit"),
        Param("cpu_threads", int, 1, "vLLM's CPU kernel threads (unpinned), both arms"),
        Param("dtype", str, "", "vLLM's dtype, both arms (e.g. float32 where bfloat16 kernels fail)"),
        Param(
            "engine_cpus",
            str,
            "",
            "cores for the engine's own processes alone, both arms (e.g. 1): the rest run every other process, as "
            "a GPU host's engine has its device and cores (default: all share every core)",
        ),
        Param("concurrency", int, 24, "streams at once"),
        Param("requests", int, 480, "streamed chat requests per arm and round"),
        Param("short_requests", int, 1200, "1-token completions per arm and round"),
        Param("max_tokens", int, 64, "output tokens per request"),
        Param("prompt_words", int, 0, "words per streamed prompt, none shared (0: one short sentence)"),
        Param("step_ms", float, 1.0, "the simulated engine's step time"),
        Param("rounds", int, 4, "passes of each arm, the other paused (medians are printed)"),
        Param("front_doors", str, "direct,haproxy", "the gateway arms, one per front door: direct, haproxy, serve"),
    )

    def check(self, options: Options) -> None:
        o = options
        if min(o["concurrency"], o["requests"], o["short_requests"], o["max_tokens"], o["max_num_seqs"]) < 1:
            raise ValueError(
                "--concurrency, --requests, --short-requests, --max-tokens, --max-num-seqs must be positive"
            )
        if o["step_ms"] < 0 or o["kv_tokens"] < 0:
            raise ValueError("--step-ms and --kv-tokens must not be negative")
        names(o["front_doors"], "--front-doors", FRONT_DOORS)
        plugin = engine_for(o["engine"])
        if o["engine_cpus"]:
            if not plugin.engine_process_titles:
                raise ValueError(
                    f"--engine-cpus: the {o['engine']} engine runs inside its worker, with no processes to pin"
                )
            parse_cpus(o["engine_cpus"])

    def run(self, options: Options) -> Figures:
        o = options
        plugin = engine_for(o["engine"])
        given = {"model": o["model"] or None, "kv_tokens": o["kv_tokens"] or None, "max_num_seqs": o["max_num_seqs"]}
        given |= {"cpu_threads": o["cpu_threads"], "step_ms": o["step_ms"], "dtype": o["dtype"] or None}
        settings, model = plugin.benchmark_settings(given)
        config = OpenAIBenchConfig(o["engine"], settings, model)
        config.concurrency, config.requests, config.max_tokens = o["concurrency"], o["requests"], o["max_tokens"]
        config.short_requests, config.prompt_words = o["short_requests"], max(0, o["prompt_words"])
        if o["engine_cpus"]:
            config.engine_cpus = tuple(sorted(parse_cpus(o["engine_cpus"])))
        doors = names(o["front_doors"], "--front-doors", FRONT_DOORS)
        out = bench_openai(config, doors, rounds=max(1, o["rounds"]))
        shape = {"short_concurrency": config.short_concurrency, "reference": plugin.reference_name}
        return {"options": dict(o), "doors": list(doors)} | shape | out

    def report(self, figures: Figures) -> str:
        o, doors = figures["options"], figures["doors"]
        words = f", {o['prompt_words']}-word prompts" if o["prompt_words"] else ""
        out = [
            f"{o['engine']} engine, streaming chat: {o['concurrency']} streams x {o['max_tokens']} output tokens"
            f"{words}, {o['requests']} requests per arm and round; light load: 1 stream; short: 1-token "
            f"completions, {figures['short_concurrency']} at once; medians of {max(1, o['rounds'])} rounds, each arm "
            "measured with the other paused"
        ]
        if o["engine_cpus"]:
            n = figures["pinned_processes"]
            out.append(
                f"engine processes on CPUs {o['engine_cpus']} alone ({n['engine']} of both arms); every other "
                f"process ({n['host']}) on the rest"
            )
        out.append(
            f"{'':<26} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'light TTFT':>11} {'short req/s':>12} "
            f"{'errors':>7} {'engine CPU':>11} {'host CPU':>9}"
        )
        labels = {"alone": figures["reference"]} | {d: f"fairgate, {d} front door" for d in doors}
        for arm, row in figures["arms"].items():
            out.append(
                f"{labels[arm]:<26} {row['output_tokens_per_s']:>9.0f} {row['ttft_p50_ms']:>7.1f}ms "
                f"{row['ttft_p99_ms']:>7.1f}ms {row['light_ttft_p50_ms']:>9.1f}ms {row['short_requests_per_s']:>12.1f} "
                f"{row['errors']:>7} {row['engine_cpu_busy']:>11.0%} {row['host_cpu_busy']:>9.0%}"
            )
        out.append(
            "(engine / host CPU: how busy those cores were in the loaded phase; engine: with --engine-cpus only)"
        )
        for arm, row in figures["arms"].items():
            if row["error_kinds"]:
                kinds = ", ".join(f"{n} x {kind}" for kind, n in sorted(row["error_kinds"].items()))
                out.append(f"errors of {labels[arm]}: {kinds}")
        for door, r in figures["ratios"].items():
            out.append(
                f"fairgate ({door}) / alone: {r['output_tokens_per_s']:.2f}x tokens/s, "
                f"{r['short_requests_per_s']:.2f}x short requests/s; TTFT p50 {r['ttft_p50_ms_overhead']:+.1f} ms "
                f"loaded, {r['light_ttft_p50_ms_overhead']:+.1f} ms at light load"
            )
            each = " ".join(f"{x['output_tokens_per_s']:.2f}" for x in figures["round_ratios"][door])
            out.append(f"  each round's tokens/s ratio (medians above): {each}")
        return "\n".join(out)
