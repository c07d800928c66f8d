"""``fairgate bench vllm``: is the gateway work-conserving in front of a real vLLM engine?

The same offered load (closed-loop clients of two tenants, 1 : 2, every request the same prompt and
``max_tokens`` with ``ignore_eos``) is driven twice in one run: straight into a vLLM engine (``AsyncLLM``
through the worker's runner, no gateway), then through the whole gateway (HTTP -> ingress -> VTC
dispatcher -> gRPC worker) to one vLLM worker with the same settings. Output tokens per second are
counted the same way both times: the tokens vLLM generated per engine step, as the runner reports
them, over the same measuring window after a warm-up. The gateway run also reports each tenant's
exact service over the window, the largest gap between them at any moment of the window (sampled
from the dispatcher four times a second) and 2U. ``--policies vtc,fcfs`` compares policies in the same
run. ``scripts/gpu_check.sh`` runs this with a Llama-3-8B-shaped model on a GPU.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Any

from fairgate.common.loopback import ray_environment
from fairgate.core import make_policy
from fairgate.core.registry import Param
from fairgate.loadgen.benches.base import Bench, Figures, Options, register
from fairgate.workers.engines.interface import GenerationParams, StepReport

PROMPT = "the tenant queue is served by the engine " * 8


@dataclass(frozen=True)
class VllmBenchConfig:
    model: str = "small"  # on a CPU, an engine whose steps are the model's arithmetic (see the README)
    kv_tokens: int = 8192
    max_num_seqs: int = 16
    clients: int = 36  # closed-loop clients in all, split 1 : 2: both tenants stay backlogged
    max_tokens: int = 32
    warmup_s: float = 5.0
    window_s: float = 20.0
    num_gpus: float = 0.0
    enforce_eager: bool | None = None

    def vllm_settings(self) -> dict[str, Any]:
        """The engine's ``workers.vllm`` settings, the same for vLLM alone and behind the gateway."""
        return {name: getattr(self, name) for name in ("model", "kv_tokens", "max_num_seqs", "enforce_eager")}

    def split(self) -> dict[str, int]:
        light = max(1, self.clients // 3)
        return {"alice": light, "bob": self.clients - light}


@dataclass
class BenchResult:
    tokens_per_s: float
    service: dict[str, float] | None = None
    max_gap: float = 0.0
    two_u: float = 0.0
    backlogged: float = 1.0  # share of samples at which every tenant had requests waiting
    mean_batch: float = 0.0  # requests running in the engine, sampled four times a second


async def direct(config: VllmBenchConfig) -> BenchResult:
    """The offered load straight into the engine."""
    from fairgate.workers.engines.vllm.runner import VllmRunner
    from fairgate.workers.engines.vllm.settings import VllmSettings

    steps: list[tuple[float, int]] = []

    def on_step(report: StepReport) -> None:
        steps.append((time.monotonic(), sum(report.new_tokens.values())))

    runner = VllmRunner(VllmSettings.from_dict(config.vllm_settings()))
    await runner.start(on_step)
    stop = asyncio.Event()
    params = GenerationParams(PROMPT, max_tokens=config.max_tokens, ignore_eos=True)
    counter = iter(range(1 << 62))

    async def client() -> None:
        while not stop.is_set():
            async for _ in runner.generate(f"direct-{next(counter)}", params):
                pass

    tasks = [asyncio.create_task(client()) for _ in range(config.clients)]
    await asyncio.sleep(config.warmup_s)
    start = time.monotonic()
    batches = []
    while (now := time.monotonic()) < start + config.window_s:
        await asyncio.sleep(min(0.25, start + config.window_s - now))
        batches.append(runner.running)
    end = time.monotonic()
    stop.set()
    await asyncio.gather(*tasks)
    await runner.stop()
    tokens = sum(n for t, n in steps if start <= t < end)
    return BenchResult(tokens / (end - start), mean_batch=sum(batches) / max(1, len(batches)))


async def through_gateway(config: VllmBenchConfig, port: int, policy: str = "vtc") -> BenchResult:
    """The same load through the gateway to one vLLM worker."""
    import openai
    import ray
    from ray import serve

    from fairgate.dispatcher.actor import dispatcher_name
    from fairgate.gateway.app import build_app, start_local_ray
    from fairgate.gateway.config import parse_config

    keys = {t: "fg-bench-" + secrets.token_hex(12) for t in config.split()}
    raw = {
        "model": config.model,
        "policy": policy,
        "workers": {"count": 1, "engine": "vllm", "vllm": config.vllm_settings(), "num_gpus": config.num_gpus},
        "tenants": [{"name": t, "api_key": k} for t, k in keys.items()],
    }
    gateway, _ = parse_config(raw, "bench")
    start_local_ray()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = build_app("bench-vllm", gateway, secrets.token_hex(16))
    await asyncio.to_thread(serve.run, app, name="bench-vllm", route_prefix="/")
    actor = ray.get_actor(dispatcher_name("bench-vllm"), namespace="fairgate")
    stop = asyncio.Event()
    failures: list[BaseException] = []

    async def client(key: str) -> None:
        c = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=300)
        while not stop.is_set():
            try:
                await c.completions.create(
                    model=config.model, prompt=PROMPT, max_tokens=config.max_tokens, extra_body={"ignore_eos": True}
                )
            except Exception as exc:  # reported: a work-conserving gateway loses nothing either
                failures.append(exc)

    try:
        tasks = [asyncio.create_task(client(keys[t])) for t, n in config.split().items() for _ in range(n)]
        await asyncio.sleep(config.warmup_s)
        first = await actor.stats.remote()
        start = time.monotonic()
        max_gap, backlogged, batches = 0.0, [], []
        while (now := time.monotonic()) < start + config.window_s:
            await asyncio.sleep(min(0.25, start + config.window_s - now))
            last = await actor.stats.remote()
            served = [last["tenants"][t]["service"] - first["tenants"][t]["service"] for t in keys]
            max_gap = max(max_gap, max(served) - min(served))
            backlogged.append(all(last["tenants"][t]["queued"] > 0 for t in keys))
            batches.append(sum(w["running"] for w in last["workers"]))
        end = time.monotonic()
        two_u = (await actor.telemetry.remote())["two_u"]  # the bound for the requests and pool seen
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        serve.delete("bench-vllm")
        ray.kill(actor)
    if failures:
        raise RuntimeError(f"{len(failures)} requests failed through the gateway, first: {failures[0]!r}")
    tenants = config.split()
    tokens = sum(last["tenants"][t]["output_tokens"] - first["tenants"][t]["output_tokens"] for t in tenants)
    service = {t: last["tenants"][t]["service"] - first["tenants"][t]["service"] for t in tenants}
    share = sum(backlogged) / max(1, len(backlogged))
    return BenchResult(tokens / (end - start), service, max_gap, two_u, share, sum(batches) / max(1, len(batches)))


def run_bench(config: VllmBenchConfig, port: int, policies: list[str]) -> dict[str, BenchResult]:
    """vLLM alone, then the gateway under each policy, one after another in this process."""
    results = {"vLLM alone": asyncio.run(direct(config))}
    for policy in policies:
        results[policy] = asyncio.run(through_gateway(config, port, policy))
    return results


@register
class VllmBench(Bench):
    """Work conservation: a vLLM engine alone against the same engine through the gateway."""

    name = "vllm"
    help = "work conservation: a vLLM engine directly vs through the gateway"
    params = (
        Param("model", str, "small", "vLLM model (default: the project's ~100M 'small', dummy weights)"),
        Param("kv_tokens", int, 8192, "KV pool of the engine, in tokens"),
        Param("max_num_seqs", int, 16, "vLLM's batch limit"),
        Param("clients", int, 36, "closed-loop clients, split 1 : 2 between two tenants"),
        Param("max_tokens", int, 32, "output tokens per request"),
        Param("seconds", float, 20.0, "measuring window, after a warm-up"),
        Param("port", int, 8001, "HTTP port on 127.0.0.1 for the gateway run"),
        Param("policies", str, "vtc", "comma-separated gateway policies to run (e.g. vtc,fcfs)"),
        Param("num_gpus", float, 0.0, "GPUs for the gateway's vLLM worker"),
        Param("eager", bool, False, "no CUDA graphs / compilation (starts faster)"),
    )

    def check(self, options: Options) -> None:
        o = options
        if min(o["kv_tokens"], o["max_num_seqs"], o["clients"], o["max_tokens"]) < 1 or o["seconds"] <= 0:
            raise ValueError("--kv-tokens, --max-num-seqs, --clients, --max-tokens and --seconds must be positive")
        for policy in self._policies(o):
            make_policy(policy)

    def run(self, options: Options) -> Figures:
        ray_environment()  # before anything imports Ray
        o = options
        config = VllmBenchConfig(
            model=o["model"],
            kv_tokens=o["kv_tokens"],
            max_num_seqs=o["max_num_seqs"],
            clients=o["clients"],
            max_tokens=o["max_tokens"],
            window_s=o["seconds"],
            num_gpus=o["num_gpus"],
            enforce_eager=True if o["eager"] else None,
        )
        results = run_bench(config, o["port"], self._policies(o))
        runs = {label: asdict(r) for label, r in results.items()}
        return {"config": asdict(config), "split": config.split(), "runs": runs}

    def report(self, figures: Figures) -> str:
        c, runs = figures["config"], figures["runs"]
        direct = runs["vLLM alone"]["tokens_per_s"]
        out = [
            f"offered load: {c['clients']} closed-loop clients {figures['split']}, {c['max_tokens']} output tokens "
            f"each, {c['window_s']:.0f} s measured after a warm-up",
            f"{'run':<12} {'tokens/s':>9} {'of alone':>9} {'batch':>6} {'alice':>10} {'bob':>10} {'max gap':>9} "
            f"{'2U':>9} {'backlogged':>11}",
        ]
        for label, r in runs.items():
            line = f"{label:<12} {r['tokens_per_s']:>9.1f} {r['tokens_per_s'] / direct:>9.1%} {r['mean_batch']:>6.1f}"
            if r["service"] is not None:
                line += (
                    f" {r['service']['alice']:>10,.0f} {r['service']['bob']:>10,.0f} {r['max_gap']:>9,.0f}"
                    f" {r['two_u']:>9,.0f} {r['backlogged']:>11.0%}"
                )
            out.append(line)
        return "\n".join(out)

    @staticmethod
    def _policies(options: Options) -> list[str]:
        return [p.strip() for p in options["policies"].split(",") if p.strip()]
