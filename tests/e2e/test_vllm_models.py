"""Two vLLM models behind one endpoint (CPU, the tiny model served under two names, each its own pool
and engine), with the official client: ``/v1/models`` per tenant, routing by the ``model`` field to
the pool's own vLLM engine, 404 ``model_not_found`` for a model a tenant may not use, and fairness
within each pool (a tenant's flood of one model buys it nothing on the other)."""

from __future__ import annotations

import asyncio

import openai
import pytest

from .gateway_helpers import MAX_TOKENS, Gateway, clients, closed_loop, deploy
from .test_vllm import KV_TOKENS, VLLM

pytestmark = pytest.mark.slow

OPEN, TEAMS = "tiny", "tiny-teams"


@pytest.fixture(scope="module")
def gw(serve_port) -> Gateway:
    vllm = {"engine": "vllm", "vllm": VLLM, "count": 1}
    gateway = deploy(
        "vllm-models",
        serve_port,
        vllm=VLLM,
        models=[{"name": OPEN, "workers": vllm}, {"name": TEAMS, "tenants": ["alice", "bob"], "workers": vllm}],
    )
    yield gateway
    gateway.delete()


def client(gw: Gateway, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=gw.keys[tenant], max_retries=0, timeout=120)


def test_each_model_is_its_own_vllm_pool_listed_per_tenant(gw):
    assert [m.id for m in client(gw, "alice").models.list()] == [OPEN, TEAMS]
    assert [m.id for m in client(gw, "carol").models.list()] == [OPEN]
    for model in (OPEN, TEAMS):
        r = client(gw, "alice").chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=5, extra_body={"ignore_eos": True}
        )
        assert r.model == model and r.usage.completion_tokens == 5  # vLLM answered under the pool's name
        stats = gw.stats(model)
        assert stats["tenants"]["alice"]["finished"] == 1
        assert [w["kv_tokens"] for w in stats["workers"]] == [KV_TOKENS]
    ids = {m: {w["id"] for w in gw.stats(m)["workers"]} for m in (OPEN, TEAMS)}
    assert not ids[OPEN] & ids[TEAMS]


def test_a_model_the_tenant_may_not_use_is_not_found(gw):
    with pytest.raises(openai.NotFoundError) as err:
        client(gw, "carol").completions.create(model=TEAMS, prompt="hi", max_tokens=2)
    assert err.value.body["code"] == "model_not_found"
    assert gw.stats(TEAMS)["tenants"].get("carol", {}).get("submitted", 0) == 0


def test_fairness_holds_within_each_vllm_pool(gw):
    """Bob floods the open model too; on the teams pool, where alice and bob both flood, they still get
    equal service within 2U."""
    c = clients(gw)

    async def scenario():
        stop = asyncio.Event()
        results: list = []
        tasks = [asyncio.create_task(closed_loop(c["bob"], OPEN, stop, results)) for _ in range(8)]
        tasks += [
            asyncio.create_task(closed_loop(c[t], TEAMS, stop, results)) for t in ("alice", "bob") for _ in range(10)
        ]
        await asyncio.sleep(4.0)
        first = await asyncio.to_thread(gw.stats, TEAMS)
        await asyncio.sleep(10.0)
        last = await asyncio.to_thread(gw.stats, TEAMS)
        stop.set()
        await asyncio.gather(*tasks)
        return first, last, results

    first, last, results = asyncio.run(scenario())
    assert [r for r in results if r != MAX_TOKENS] == []
    for t in ("alice", "bob"):
        assert first["tenants"][t]["queued"] > 0 and last["tenants"][t]["queued"] > 0, t
    got = {t: last["tenants"][t]["service"] - first["tenants"][t]["service"] for t in ("alice", "bob")}
    two_u = 2 * (2 * KV_TOKENS)  # U = max(w_p, w_q) × the pool, with the default linear cost (1, 2)
    assert got["alice"] > 0 and abs(got["alice"] - got["bob"]) <= two_u, got
    assert gw.stats(OPEN)["tenants"]["bob"]["service"] > 0
