"""``fairgate loadgen``: replay a workload against any OpenAI-compatible endpoint and measure it.

Each request is sent at its arrival time as a streaming completion (prompt of the workload's length,
``max_tokens`` = its output length, ``ignore_eos`` so the server generates exactly that). What comes
back feeds the same ``ServiceRecorder`` the simulator uses, so the report and plots have the same
shape: service per tenant over time (from the tokens received), TTFT, latency, errors. Seen from a
client, a tenant is backlogged while one of its requests has been sent and no token has come back.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import openai
from tqdm import tqdm

from fairgate.core.costs import CostFunction, LinearCost
from fairgate.core.fairness import in_flight_reach, two_u
from fairgate.loadgen.metrics import RunSummary, ServiceRecorder, summarize
from fairgate.loadgen.workload import TraceRequest, Workload


@dataclass
class ReplayConfig:
    url: str
    keys: dict[str, str]
    model: str = "fairgate-sim"
    policy_label: str = "endpoint"
    duration_s: float | None = None  # replay only the first part of the workload
    pool_tokens: int = 20_000  # the endpoint's total KV pool, for the 2U bound
    overcommit: float = 2.0  # the endpoint's scheduler setting of that name (its pools in flight)
    cost: CostFunction = field(default_factory=LinearCost)
    progress: bool = True
    timeout_s: float = 600.0
    prompt: Callable[[TraceRequest], str] | None = None  # the prompt's text (None: the word "word", repeated)
    routes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # tenant -> base URLs its requests take in turn
    bound: float | None = None  # the endpoint's stated bound on the gap (None: 2U of the pool above)


class _Live:
    """Who is waiting for a first token, per tenant (the client-visible backlog)."""

    def __init__(self, tenants: list[str]) -> None:
        self.waiting = dict.fromkeys(tenants, 0)


async def replay(workload: Workload, config: ReplayConfig) -> tuple[RunSummary, dict[str, int]]:
    workload = workload.truncated(config.duration_s)
    horizon = workload.duration_s
    requests = workload.requests
    missing = sorted({r.tenant for r in requests} - set(config.keys))
    if missing:
        raise ValueError(f"no API key for tenant(s) {', '.join(missing)} (give them in --keys)")
    tenants = workload.tenants
    rec = ServiceRecorder(tenants, [workload.weight(t) for t in tenants], config.cost)
    live = _Live(tenants)
    errors = dict.fromkeys(tenants, 0)
    urls = {t: config.routes.get(t) or (config.url,) for t in tenants}
    clients = {
        (t, url): openai.AsyncOpenAI(base_url=url, api_key=config.keys[t], max_retries=0, timeout=config.timeout_s)
        for t in tenants
        for url in urls[t]
    }
    turns = {t: itertools.cycle(urls[t]) for t in tenants}
    route = [next(turns[r.tenant]) for r in requests]  # each tenant's requests take its URLs in turn
    prompt_of = config.prompt or (lambda r: "word " * r.prompt_tokens)
    bar = tqdm(total=len(requests), unit="req", desc=f"{workload.name}", disable=None if config.progress else True)
    start = time.monotonic()

    def now() -> float:
        return time.monotonic() - start

    def sample() -> None:
        rec.sample(now(), [live.waiting[t] > 0 for t in tenants])

    async def one(i: int) -> None:
        r = requests[i]
        delay = r.arrival_s - now()
        if delay > 0:
            await asyncio.sleep(delay)
        rid = str(i)
        rec.on_arrival(rid, r.tenant, now(), r.prompt_tokens, r.output_tokens)
        live.waiting[r.tenant] += 1
        sample()
        got_first = False
        try:
            stream = await clients[r.tenant, route[i]].completions.create(
                model=config.model,
                prompt=prompt_of(r),
                max_tokens=r.output_tokens,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            seen = 0
            async for chunk in stream:
                if chunk.usage is not None:  # exact count: settle any difference with what was counted
                    if chunk.usage.completion_tokens > seen:
                        rec.on_step(now(), {}, {rid: chunk.usage.completion_tokens - seen}, [])
                    details = chunk.usage.prompt_tokens_details
                    if got_first and details is not None and details.cached_tokens:
                        rec.on_cache_report(rid, details.cached_tokens)
                    continue
                text = chunk.choices[0].text if chunk.choices else ""
                if not text:
                    continue
                tokens = max(1, len(text.split()))
                started = {} if got_first else {rid: r.prompt_tokens}
                if not got_first:
                    got_first = True
                    live.waiting[r.tenant] -= 1
                seen += tokens
                rec.on_step(now(), started, {rid: tokens}, [])
                sample()
            rec.on_step(now(), {}, {}, [rid])
        except (openai.APIError, OSError) as exc:  # counted per tenant; the report lists them
            errors[r.tenant] += 1
            if isinstance(exc, openai.RateLimitError):
                rec.on_reject(rid, now(), False)
        finally:
            if not got_first:
                live.waiting[r.tenant] -= 1
            sample()
            bar.update(1)

    tasks = [asyncio.create_task(one(i)) for i in range(len(requests))]
    _, unfinished = await asyncio.wait(tasks, timeout=max(0.0, horizon - now()))
    for task in unfinished:  # like the simulator, measure [0, horizon]; hang up on what is left
        task.cancel()
    await asyncio.gather(*unfinished, return_exceptions=True)
    bar.close()
    for c in clients.values():
        await c.close()
    summary = summarize(
        rec,
        workload=workload.name,
        policy=config.policy_label,
        replicas=0,
        kv_tokens=config.pool_tokens,
        duration_s=max(horizon, 1e-9),
        bound=config.bound
        if config.bound is not None
        else two_u(config.cost, *workload.longest(), in_flight_reach(config.pool_tokens, config.overcommit)),
    )
    summary.report["errors"] = errors
    return summary, errors
