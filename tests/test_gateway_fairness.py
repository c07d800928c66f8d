"""Fairness and membership end to end: tenants flooding real simulated workers through the gateway."""

from __future__ import annotations

import asyncio
import statistics
import time

import openai
import pytest

from .gateway_helpers import Gateway, deploy

PROMPT = "word " * 60  # 60 prompt tokens
MAX_TOKENS = 40
KV_PER_WORKER = 400  # 4 requests of 100 tokens per worker
LOAD = {"alice": 12, "bob": 24}  # closed-loop clients, 4.5x the 8 slots: both always backlogged


async def closed_loop(client: openai.AsyncOpenAI, stop: asyncio.Event, results: list) -> None:
    while not stop.is_set():
        try:
            r = await client.completions.create(
                model="fairgate-sim", prompt=PROMPT, max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True}
            )
            results.append(r.usage.completion_tokens)
        except Exception as exc:  # recorded and asserted on: nothing may fail
            results.append(exc)


async def light_probe(client: openai.AsyncOpenAI, stop: asyncio.Event, ttfts: list[float]) -> None:
    """A light tenant: one short streaming request at a time, now and then; records first-token latency."""
    while not stop.is_set():
        start = time.monotonic()
        stream = await client.completions.create(
            model="fairgate-sim", prompt="hi", max_tokens=2, stream=True, extra_body={"ignore_eos": True}
        )
        first = None
        async for _ in stream:
            if first is None:
                first = time.monotonic() - start
        ttfts.append(first)
        await asyncio.sleep(0.5)


def clients(gw: Gateway) -> dict[str, openai.AsyncOpenAI]:
    return {
        t: openai.AsyncOpenAI(base_url=gw.base_url, api_key=k, max_retries=0, timeout=120) for t, k in gw.keys.items()
    }


async def overload(gw: Gateway, seconds: float):
    """Returns (service of each heavy tenant between two moments when both were backlogged,
    the light tenant's first-token latencies, every heavy result)."""
    c = clients(gw)
    stop = asyncio.Event()
    results: list = []
    ttfts: list[float] = []
    tasks = [asyncio.create_task(closed_loop(c[t], stop, results)) for t, n in LOAD.items() for _ in range(n)]
    tasks.append(asyncio.create_task(light_probe(c["carol"], stop, ttfts)))
    await asyncio.sleep(3.0)  # warm up until both heavy tenants are backlogged
    first = await asyncio.to_thread(gw.stats)
    await asyncio.sleep(seconds)
    last = await asyncio.to_thread(gw.stats)
    stop.set()
    await asyncio.gather(*tasks)
    for t in ("alice", "bob"):
        assert first["tenants"][t]["queued"] > 0 and last["tenants"][t]["queued"] > 0, t
    got = {t: last["tenants"][t]["service"] - first["tenants"][t]["service"] for t in ("alice", "bob")}
    return got, ttfts, results


@pytest.fixture(scope="module")
def runs(serve_port):
    out = {}
    for policy in ("vtc", "fcfs"):
        gw = deploy(f"fair-{policy}", serve_port, policy=policy, workers=2, kv_tokens=KV_PER_WORKER, step_s=0.02)
        try:
            out[policy] = asyncio.run(overload(gw, seconds=10.0))
        finally:
            gw.delete()
    return out


@pytest.mark.slow
def test_vtc_keeps_two_flooding_tenants_within_2u_of_the_total_pool(runs):
    got, _, results = runs["vtc"]
    pool = 2 * KV_PER_WORKER
    two_u = 2 * max(60, 2 * pool)
    assert got["alice"] > 0 and abs(got["alice"] - got["bob"]) <= two_u
    assert all(r == MAX_TOKENS for r in results)


@pytest.mark.slow
def test_fcfs_gives_the_heavier_sender_clearly_more(runs):
    got, _, results = runs["fcfs"]
    assert got["bob"] > 1.4 * got["alice"]
    assert all(r == MAX_TOKENS for r in results)


@pytest.mark.slow
def test_light_tenant_first_token_stays_low_under_vtc(runs):
    vtc = statistics.mean(runs["vtc"][1])
    fcfs = statistics.mean(runs["fcfs"][1])
    assert vtc < 0.5 * fcfs
    assert vtc < 1.0


@pytest.mark.slow
def test_workers_added_and_drained_under_load_lose_nothing(serve_port):
    gw = deploy("member", serve_port, workers=1, kv_tokens=KV_PER_WORKER, step_s=0.02)
    try:

        async def scenario():
            c = clients(gw)
            stop = asyncio.Event()
            results: list = []
            tasks = [asyncio.create_task(closed_loop(c["alice"], stop, results)) for _ in range(8)]
            await asyncio.sleep(2.0)
            await asyncio.to_thread(gw.redeploy, 2)  # a worker joins
            seen = len((await asyncio.to_thread(gw.stats))["workers"])
            await asyncio.sleep(3.0)
            await asyncio.to_thread(gw.redeploy, 1)  # one is drained and removed
            await asyncio.sleep(3.0)
            stop.set()
            await asyncio.gather(*tasks)
            return seen, results, await asyncio.to_thread(gw.stats)

        seen, results, stats = asyncio.run(scenario())
        assert seen == 2
        failures = [r for r in results if not isinstance(r, int)]
        assert failures == [] and all(r == MAX_TOKENS for r in results) and len(results) > 20
        assert len(stats["workers"]) == 1 and stats["in_flight"] == 0 and stats["queue_depth"] == 0
    finally:
        gw.delete()
