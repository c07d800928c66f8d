"""Fairness and membership end to end: tenants flooding real simulated workers through the gateway."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from .gateway_helpers import MAX_TOKENS, clients, closed_loop, deploy, overload

KV_PER_WORKER = 400  # 4 requests of 100 tokens per worker
LOAD = {"alice": 12, "bob": 24}  # closed-loop clients, 4.5x the 8 slots: both always backlogged


@pytest.fixture(scope="module")
def runs(serve_port):
    out = {}
    for policy in ("vtc", "fcfs"):
        gw = deploy(f"fair-{policy}", serve_port, policy=policy, workers=2, kv_tokens=KV_PER_WORKER, step_s=0.02)
        try:
            out[policy] = asyncio.run(overload(gw, seconds=10.0, load=LOAD))
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
            tasks = [asyncio.create_task(closed_loop(c["alice"], gw.config.model, stop, results)) for _ in range(8)]
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
