"""LoRA adapters through the gateway, on simulated workers: adapters are model names a tenant may use
(its tree nodes'), listed with the base model; anyone else's answers 404 as a model that does not
exist. The admin API registers, moves and deletes them live, refusing bad changes whole. Two tenants
on different adapters share the pool fairly even when a batch holds one adapter at a time, and the
metrics say where each adapter is and what its loads cost."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from .gateway_helpers import Gateway, deploy, scrape

ADAPTERS = [
    {"name": "acme/support", "base_model": "fairgate-sim", "path": "/adapters/support", "nodes": ["support"]},
    {"name": "acme/sales", "base_model": "fairgate-sim", "path": "/adapters/sales", "nodes": ["bob"]},
    {"name": "shared", "base_model": "fairgate-sim", "path": "/adapters/shared", "nodes": [""]},
]


@pytest.fixture(scope="module")
def gw(serve_port) -> Gateway:
    gateway = deploy(
        "adapters",
        serve_port,
        workers=1,
        max_loras=1,  # one adapter per batch: the tenants' adapters must take turns
        tree=[{"name": "support"}],
        tenant_fields={"alice": {"parent": "support"}},
        adapters=ADAPTERS,
    )
    yield gateway
    gateway.delete()


def admin(gw: Gateway, method: str, path: str, **kw) -> httpx.Response:
    root = gw.base_url.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {gw.admin_key}"}
    return httpx.request(method, f"{root}/admin{path}", headers=headers, timeout=30, **kw)


def client(gw: Gateway, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=gw.keys[tenant], max_retries=0, timeout=60)


def models(gw: Gateway, tenant: str) -> dict[str, dict]:
    return {m.id: m.model_dump() for m in client(gw, tenant).models.list().data}


def test_models_list_the_base_and_the_adapters_each_key_may_use(gw):
    alice, bob, carol = (models(gw, t) for t in ("alice", "bob", "carol"))
    assert set(alice) == {"fairgate-sim", "acme/support", "shared"}
    assert set(bob) == {"fairgate-sim", "acme/sales", "shared"}
    assert set(carol) == {"fairgate-sim", "shared"}
    assert alice["acme/support"]["parent"] == "fairgate-sim" and "path" not in alice["acme/support"]
    assert client(gw, "alice").models.retrieve("acme/support").id == "acme/support"


def test_an_adapter_serves_its_tenants_and_answers_others_as_a_model_that_does_not_exist(gw):
    r = client(gw, "alice").completions.create(
        model="acme/support", prompt="hello there", max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert r.model == "acme/support" and r.usage.completion_tokens == 4
    for call in (
        lambda: client(gw, "bob").completions.create(model="acme/support", prompt="hi", max_tokens=2),
        lambda: client(gw, "bob").models.retrieve("acme/support"),
        lambda: client(gw, "carol").chat.completions.create(
            model="acme/sales", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        ),
    ):
        with pytest.raises(openai.NotFoundError) as refused:
            call()
        assert refused.value.body["code"] == "model_not_found"
    # a model that does not exist reads the same: nothing says an adapter is someone else's
    with pytest.raises(openai.NotFoundError) as missing:
        client(gw, "bob").models.retrieve("no-such-model")
    assert missing.value.body["message"].replace("no-such-model", "acme/sales") == refused.value.body["message"]


def test_admin_routes_register_move_and_delete_adapters_and_refuse_bad_changes_whole(gw):
    listed = admin(gw, "GET", "/adapters").json()["data"]
    assert {a["name"] for a in listed} == {a["name"] for a in ADAPTERS}
    new = {"name": "acme/new", "base_model": "fairgate-sim", "path": "/adapters/new", "nodes": ["carol"]}
    refusals = [
        ("POST", "/adapters", {**new, "base_model": "no-such-base"}, 400, "no model"),
        ("POST", "/adapters", {**new, "nodes": ["no-such-node"]}, 400, "no tree node or tenant"),
        ("POST", "/adapters", {**new, "name": "shared"}, 409, "already exists"),
        ("POST", "/adapters", {**new, "name": "fairgate-sim"}, 409, "a model's name"),
        ("POST", "/adapters", {**new, "colour": "red"}, 400, "unknown field"),
        ("POST", "/adapters", {k: v for k, v in new.items() if k != "path"}, 400, "path"),
        ("PATCH", "/adapters/shared", {"nodes": ["no-such-node"]}, 400, "no tree node or tenant"),
        ("PATCH", "/adapters/shared", {"base_model": "other"}, 400, "unknown field"),
        ("PATCH", "/adapters/no-such-adapter", {"nodes": [""]}, 404, "no adapter"),
        ("DELETE", "/adapters/no-such-adapter", None, 404, "no adapter"),
    ]
    for method, path, body, status, words in refusals:
        r = admin(gw, method, path, json=body)
        assert r.status_code == status and words in r.json()["error"]["message"], (method, path, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert admin(gw, "GET", "/adapters").json()["data"] == listed  # nothing changed

    created = admin(gw, "POST", "/adapters", json=new)
    assert created.status_code == 201 and created.json() == new
    assert "acme/new" in models(gw, "carol")  # at once, through the replica that made it
    r = client(gw, "carol").completions.create(model="acme/new", prompt="hi", max_tokens=2)
    assert r.model == "acme/new"
    moved = admin(gw, "PATCH", "/adapters/acme/new", json={"nodes": ["bob"]})
    assert moved.status_code == 200 and moved.json()["nodes"] == ["bob"]
    assert "acme/new" not in models(gw, "carol") and "acme/new" in models(gw, "bob")
    with pytest.raises(openai.NotFoundError):
        client(gw, "carol").completions.create(model="acme/new", prompt="hi", max_tokens=2)
    assert admin(gw, "DELETE", "/adapters/acme/new").json() == {"name": "acme/new", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client(gw, "bob").completions.create(model="acme/new", prompt="hi", max_tokens=2)
    tenant_key = {"Authorization": f"Bearer {gw.keys['alice']}"}
    root = gw.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/admin/adapters", headers=tenant_key, timeout=30).status_code == 403


async def _closed_loops(gw: Gateway, seconds: float) -> dict[str, int]:
    """alice on her team's adapter and bob on his, 6 closed loops each, for ``seconds``."""
    stop = asyncio.Event()
    done = {"alice": 0, "bob": 0}

    async def loop(tenant: str, model: str) -> None:
        c = openai.AsyncOpenAI(base_url=gw.base_url, api_key=gw.keys[tenant], max_retries=0, timeout=120)
        while not stop.is_set():
            await c.completions.create(model=model, prompt="word " * 40, max_tokens=20, extra_body={"ignore_eos": True})
            done[tenant] += 1

    tasks = [asyncio.create_task(loop("alice", "acme/support")) for _ in range(6)]
    tasks += [asyncio.create_task(loop("bob", "acme/sales")) for _ in range(6)]
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks)
    return done


def test_two_tenants_on_different_adapters_share_the_pool_fairly(gw):
    before = gw.stats()["tenants"]
    done = asyncio.run(_closed_loops(gw, 8.0))
    after = gw.stats()
    service = {t: after["tenants"][t]["service"] - before.get(t, {}).get("service", 0.0) for t in ("alice", "bob")}
    assert min(done.values()) > 5, done
    assert abs(service["alice"] - service["bob"]) <= 0.2 * sum(service.values()), service
    worker = after["workers"][0]
    assert worker["max_loras"] == 1 and set(worker["host_adapters"]) >= {"acme/support", "acme/sales"}

    samples = scrape(gw)
    loads = {k: v for k, v in samples.items() if k[0] == "fairgate_adapter_loads_total"}
    # the batch holds one adapter: they took turns, each turn a load from host memory
    assert loads[("fairgate_adapter_loads_total", "")] >= 2
    text = httpx.get(
        gw.base_url.removesuffix("/v1") + "/metrics", headers={"Authorization": f"Bearer {gw.admin_key}"}, timeout=30
    ).text
    assert 'fairgate_adapter_loads_total{adapter="acme/sales"}' in text
    assert 'fairgate_adapter_resident{adapter="acme/support",tier="host",worker=' in text
    assert 'fairgate_adapter_load_seconds_total{adapter="acme/support"}' in text
