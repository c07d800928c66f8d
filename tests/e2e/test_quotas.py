"""Promises a tenant can hold, end to end. Token quotas: counted once in the dispatcher for every
ingress replica, so concurrent requests through two replicas never take a tenant past its quota; over
it, OpenAI's 429 ``insufficient_quota`` with Retry-After at the window's turn; each key reads its own
usage, the admin every quota's. First-token objectives: a class that sheds what it cannot serve in
time answers at once with 503 ``objective_unreachable``, the objective named, and Retry-After."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from .gateway_helpers import Gateway, deploy, scrape

QUOTA = 400  # carol's tokens per hour (prompt and output)
# an objective no engine meets once its first-token delay is measured: the class sheds from then on
CLASSES = [{"name": "standard"}, {"name": "realtime", "tier": "priority", "ttft_s": 0.001, "on_miss": "shed"}]


@pytest.fixture(scope="module")
def gw(serve_port) -> Gateway:
    gateway = deploy(
        "quotas",
        serve_port,
        workers=2,
        ingress_replicas=2,
        quotas=[{"node": "carol", "window": "hour", "max_tokens": QUOTA}],
        classes=CLASSES,
    )
    yield gateway
    gateway.delete()


def test_concurrent_requests_never_take_a_tenant_past_its_quota(gw):
    async def one(client: openai.AsyncOpenAI):
        try:
            r = await client.completions.create(
                model="fairgate-sim", prompt="word " * 10, max_tokens=40, extra_body={"ignore_eos": True}
            )
            return r.usage.prompt_tokens + r.usage.completion_tokens
        except openai.RateLimitError as exc:
            return exc

    async def flood():
        clients = [
            openai.AsyncOpenAI(base_url=gw.base_url, api_key=gw.keys["carol"], max_retries=0, timeout=60)
            for _ in range(4)
        ]
        return await asyncio.gather(*(one(clients[i % 4]) for i in range(24)))

    results = asyncio.run(flood())
    served = [r for r in results if isinstance(r, int)]
    refused = [r for r in results if not isinstance(r, int)]
    assert served and refused and sum(served) <= QUOTA
    body = refused[0].body
    assert refused[0].status_code == 429 and body["type"] == "insufficient_quota"
    assert body["code"] == "insufficient_quota" and "'carol'" in body["message"]
    assert 0 < int(refused[0].response.headers["Retry-After"]) <= 3600

    usage = httpx.get(gw.base_url + "/usage", headers={"Authorization": f"Bearer {gw.keys['carol']}"}).json()
    (row,) = usage["quotas"]
    assert usage["tenant"] == "carol" and row["used_tokens"] == sum(served) and row["held_tokens"] == 0
    assert row["remaining_tokens"] == QUOTA - sum(served)

    r = openai.OpenAI(base_url=gw.base_url, api_key=gw.keys["alice"], max_retries=0).completions.create(
        model="fairgate-sim", prompt="word " * 10, max_tokens=40
    )
    assert r.usage.completion_tokens > 0  # no quota on alice
    mine = httpx.get(gw.base_url + "/usage", headers={"Authorization": f"Bearer {gw.keys['alice']}"}).json()
    assert mine["quotas"] == []


def test_only_the_admin_reads_every_quota(gw):
    admin = httpx.get(
        gw.base_url.removesuffix("/v1") + "/admin/usage", headers={"Authorization": f"Bearer {gw.admin_key}"}
    )
    assert admin.status_code == 200 and [row["node"] for row in admin.json()["data"]] == ["carol"]
    tenant = httpx.get(
        gw.base_url.removesuffix("/v1") + "/admin/usage", headers={"Authorization": f"Bearer {gw.keys['bob']}"}
    )
    assert tenant.status_code == 403


def test_a_class_that_cannot_meet_its_objective_answers_at_once_naming_it(gw):
    client = openai.OpenAI(base_url=gw.base_url, api_key=gw.keys["bob"], max_retries=0, timeout=60)
    served, deadline = 0, time.monotonic() + 60
    while True:  # the first requests go while nothing is measured (nothing is enforced then)
        try:
            r = client.completions.create(
                model="fairgate-sim", prompt="word " * 10, max_tokens=8, extra_body={"service_tier": "priority"}
            )
        except openai.InternalServerError as exc:
            refused = exc
            break
        assert r.usage.completion_tokens > 0 and r.model_extra["service_tier"] == "priority"
        served += 1
        assert time.monotonic() < deadline, f"{served} requests served, none shed"
        time.sleep(0.3)
    assert served >= 1
    body = refused.body
    assert refused.status_code == 503 and body["code"] == "objective_unreachable"
    assert "'realtime'" in body["message"] and "0.001 s first-token objective" in body["message"]
    assert int(refused.response.headers["Retry-After"]) >= 1
    plain = client.completions.create(model="fairgate-sim", prompt="word " * 10, max_tokens=8)
    assert plain.usage.completion_tokens > 0  # the default class has no objective: served
    samples = scrape(gw)
    assert samples[("fairgate_objective_shed_total", "")] >= 1
    assert samples[("fairgate_objective_admitted_total", "")] >= served
    stats = gw.stats()
    assert stats["tenants"]["bob~realtime"]["queued"] == stats["tenants"]["bob~realtime"]["in_flight"] == 0
