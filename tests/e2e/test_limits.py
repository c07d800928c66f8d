"""Queue limits end to end: a tenant over its queue cap gets 429, a full gateway queue and a request
waiting too long get 503, all OpenAI-shaped with Retry-After; nothing admitted is lost."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from .gateway_helpers import Gateway, deploy

LIMITS = {"max_queued_per_tenant": 2, "max_queued": 3, "max_queue_s": 2.0}


@pytest.fixture(scope="module")
def gw(serve_port) -> Gateway:
    # one worker running one request at a time, none waiting inside it, 100 ms a step: 60 tokens take 6 s
    gateway = deploy(
        "limits", serve_port, workers=1, kv_tokens=100, step_s=0.1, limits=LIMITS, max_running=1, engine_queue=0
    )
    yield gateway
    gateway.delete()


async def _ask(gw: Gateway, tenant: str, max_tokens: int):
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key=gw.keys[tenant], max_retries=0, timeout=60)
    try:
        r = await client.completions.create(
            model="fairgate-sim", prompt="word " * 30, max_tokens=max_tokens, extra_body={"ignore_eos": True}
        )
        return r.usage.completion_tokens
    except openai.APIStatusError as exc:
        return exc


def test_queue_caps_and_queue_timeout(gw):
    async def scenario():
        running = asyncio.create_task(_ask(gw, "alice", 60))  # occupies the worker for 6 s
        await asyncio.sleep(0.5)
        queued = [asyncio.create_task(_ask(gw, "alice", 5)) for _ in range(2)]
        queued.append(asyncio.create_task(_ask(gw, "bob", 5)))
        while (await asyncio.to_thread(gw.stats))["queue_depth"] < 3:
            await asyncio.sleep(0.02)
        over_tenant = await _ask(gw, "alice", 5)
        over_total = await _ask(gw, "carol", 5)
        return await running, [await q for q in queued], over_tenant, over_total

    running, queued, over_tenant, over_total = asyncio.run(scenario())
    assert running == 60  # admitted and served in full
    assert over_tenant.status_code == 429 and over_tenant.response.headers["retry-after"].isdigit()
    assert over_tenant.body["code"] == "tenant_queue_full"
    assert over_total.status_code == 503 and over_total.body["code"] == "queue_full"
    assert over_total.response.headers["retry-after"].isdigit()
    # the three queued requests waited behind the 6-second one, past the 2-second limit
    for outcome in queued:
        assert isinstance(outcome, openai.APIStatusError), outcome
        assert outcome.status_code == 503 and outcome.body["code"] == "queue_timeout"
        assert outcome.body["type"] == "server_error" and outcome.response.headers["retry-after"].isdigit()
    stats = gw.stats()
    assert stats["queue_depth"] == 0 and stats["pending_submits"] == 0
    assert stats["tenants"]["alice"]["rejected"] == 1 and stats["tenants"]["carol"]["rejected"] == 1


def test_a_request_served_in_time_is_not_expired(gw):
    assert asyncio.run(_ask(gw, "bob", 5)) == 5


@pytest.mark.parametrize("door", ["base_url", "proxied_url"], ids=["direct", "serve-proxy"])
def test_a_client_that_leaves_while_queued_withdraws_its_request(gw, door):
    """A client gone while its request waits in the dispatcher's queue (nothing reads from its
    connection then): the front door notices, and the request is withdrawn, never run."""

    async def scenario():
        running = asyncio.create_task(_ask(gw, "alice", 15))  # 45 of the worker's 100 KV tokens for 1.5 s
        await _until(lambda s: s["in_flight"] == 1)
        body = {"model": "fairgate-sim", "prompt": "word " * 30, "max_tokens": 40, "ignore_eos": True}  # 70 more
        headers = {"Authorization": f"Bearer {gw.keys['carol']}"}
        async with httpx.AsyncClient(timeout=30, headers=headers) as client:
            leaving = asyncio.create_task(client.post(getattr(gw, door) + "/completions", json=body))
            await _until(lambda s: s["tenants"]["carol"]["queued"] == 1)
            leaving.cancel()  # the client closes its connection while queued
        await _until(lambda s: s["tenants"]["carol"]["queued"] == 0)
        still_running = not running.done()
        return await running, still_running, await asyncio.to_thread(gw.stats)

    async def _until(condition, timeout_s: float = 10.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not condition(await asyncio.to_thread(gw.stats)):
            assert asyncio.get_running_loop().time() < deadline, "the gateway never got there"
            await asyncio.sleep(0.02)

    served, still_running, stats = asyncio.run(scenario())
    assert served == 15 and still_running  # withdrawn while the worker was still busy
    carol = stats["tenants"]["carol"]
    assert carol["queued"] == 0 and carol["finished"] == 0 and stats["pending_submits"] == 0
