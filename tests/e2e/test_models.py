"""Two models behind one endpoint (simulated workers), with the official client: each model its own
pool of workers, routed by the ``model`` field; ``/v1/models`` lists what a tenant may use; a model a
tenant may not use is a 404 like one that does not exist; fairness holds per pool (a tenant's heavy
use of one model costs it nothing on the other); tenants, keys and the live page are shared."""

from __future__ import annotations

import asyncio
from functools import partial

import httpx
import openai
import pytest

from .gateway_helpers import MAX_TOKENS, Gateway, backlogged, clients, closed_loop, deploy, stats_when_backlogged

pytestmark = pytest.mark.slow

OPEN, RESTRICTED = "sim-open", "sim-teams"


@pytest.fixture(scope="module")
def gw(serve_port) -> Gateway:
    gateway = deploy(
        "models",
        serve_port,
        tenants=("alice", "bob", "carol"),
        models=[
            {"name": OPEN, "workers": {"count": 1, "kv_tokens": 4000}},
            {
                "name": RESTRICTED,
                "tenants": ["alice", "bob"],
                "workers": {"count": 1, "kv_tokens": 2000, "max_running": 2},
            },
        ],
    )
    yield gateway
    gateway.delete()


def client(gw: Gateway, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=gw.keys[tenant], max_retries=0, timeout=60)


def test_models_are_listed_per_tenant_and_routed_by_name(gw):
    assert [m.id for m in client(gw, "alice").models.list()] == [OPEN, RESTRICTED]
    assert [m.id for m in client(gw, "carol").models.list()] == [OPEN]
    assert client(gw, "alice").models.retrieve(RESTRICTED).id == RESTRICTED
    for model in (OPEN, RESTRICTED):
        r = client(gw, "alice").completions.create(
            model=model, prompt="hi there", max_tokens=3, extra_body={"ignore_eos": True}
        )
        assert r.model == model and r.usage.completion_tokens == 3
    assert gw.stats(OPEN)["tenants"]["alice"]["finished"] == 1
    assert gw.stats(RESTRICTED)["tenants"]["alice"]["finished"] == 1
    workers = {m: {w["id"] for w in gw.stats(m)["workers"]} for m in (OPEN, RESTRICTED)}
    assert len(workers[OPEN]) == len(workers[RESTRICTED]) == 1 and not workers[OPEN] & workers[RESTRICTED]


def test_a_model_the_tenant_may_not_use_is_not_found_like_an_unknown_one(gw):
    errors = []
    for model in (RESTRICTED, "no-such-model"):
        with pytest.raises(openai.NotFoundError) as err:
            client(gw, "carol").chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        errors.append(err.value.body)
        with pytest.raises(openai.NotFoundError):
            client(gw, "carol").models.retrieve(model)
    assert errors[0]["code"] == errors[1]["code"] == "model_not_found"
    assert errors[0]["message"].replace(RESTRICTED, "?") == errors[1]["message"].replace("no-such-model", "?")
    assert gw.stats(RESTRICTED)["tenants"]["carol"]["submitted"] == 0


def test_fairness_is_per_pool_and_the_live_page_shows_both(gw):
    """Bob floods the open model alone, and both alice and bob flood the restricted one: on the
    restricted pool they get equal service however much bob used the other."""
    c = clients(gw)

    async def scenario():
        stop = asyncio.Event()
        results: list = []
        tasks = [asyncio.create_task(closed_loop(c["bob"], OPEN, stop, results)) for _ in range(6)]
        tasks += [
            asyncio.create_task(closed_loop(c[t], RESTRICTED, stop, results))
            for t in ("alice", "bob")
            for _ in range(4)
        ]
        await asyncio.sleep(3.0)
        first = await stats_when_backlogged(partial(gw.stats, RESTRICTED), ("alice", "bob"))
        await asyncio.sleep(6.0)
        last = await stats_when_backlogged(partial(gw.stats, RESTRICTED), ("alice", "bob"))
        async with httpx.AsyncClient(timeout=30) as http:
            page = await http.get(
                gw.base_url.removesuffix("/v1") + "/admin/dashboard.json",
                headers={"Authorization": f"Bearer {gw.admin_key}"},
            )
        stop.set()
        await asyncio.gather(*tasks)
        return first, last, results, page

    first, last, results, page = asyncio.run(scenario())
    assert all(r == MAX_TOKENS for r in results), [r for r in results if r != MAX_TOKENS][:3]
    assert backlogged(first, ("alice", "bob")) and backlogged(last, ("alice", "bob")), (first, last)
    got = {t: last["tenants"][t]["service"] - first["tenants"][t]["service"] for t in ("alice", "bob")}
    data = page.json()
    assert set(data["pools"]) == {OPEN, RESTRICTED}
    restricted = data["pools"][RESTRICTED]
    assert got["alice"] > 0 and abs(got["alice"] - got["bob"]) <= restricted["two_u"], (got, restricted["two_u"])
    open_stats = gw.stats(OPEN)
    assert open_stats["tenants"]["bob"]["service"] > got["bob"]  # bob's flood of the open model
    assert open_stats["tenants"]["alice"]["finished"] <= 1  # alice's restricted load never reached the open pool
    # the page reads the live pool: what it counts finished only grows (service may step back by a
    # cached-prefix correction or a refund, so it is not the figure to compare)
    assert restricted["tenants"]["alice"]["finished"] >= last["tenants"]["alice"]["finished"]
