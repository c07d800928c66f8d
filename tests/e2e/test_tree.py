"""The tenant tree and request classes through the whole gateway (real Ray, gRPC, HTTP, Redis, the
official openai client): the tree comes from the configuration, a reweight through the admin API
under load shows in the shares, and the tree, its weights and counters survive a dispatcher restart
with Redis. One run checks it all; bad changes and classes a key may not use get clear 400s.

Two organisations: ``org-a`` holds ``team-many`` with three keys, ``org-b`` one key, ``solo``, that
mixes interactive requests with batch ones (``service_tier: flex``).
"""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import openai
import pytest
import ray

from fairgate.dispatcher.actor import dispatcher_name
from tests.conftest import RedisServer
from tests.e2e.gateway_helpers import Gateway, deploy, scrape

pytestmark = pytest.mark.slow

PROMPT = "word " * 60
MAX_TOKENS = 40
WINDOW_S = 12.0  # each measured window of shares
TREE = [
    {"name": "org-a", "weight": 1},
    {"name": "org-b", "weight": 1},
    {"name": "team-many", "parent": "org-a", "weight": 1},
]
CLASSES = [
    {"name": "interactive", "tier": "default", "weight": 3, "ttft_s": 5},
    {"name": "batch", "tier": "flex", "weight": 1},
]
KEYS = ("a1", "a2", "a3", "solo")
# more than each key can have running at once, at any of the weights tried: every key stays backlogged
CLIENTS = {"a1": 4, "a2": 4, "a3": 4, "solo": 12}


@pytest.fixture(scope="module")
def tree_redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("tree-redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tree_gateway(serve_port, tree_redis):
    gw = deploy(
        "tree",
        serve_port,
        workers=2,
        kv_tokens=4000,
        step_s=0.04,  # requests of 1.6 s: the clients' round trips are small beside them
        tenants=KEYS,
        max_running=4,
        state={"redis_url": tree_redis.url, "snapshot_interval_s": 0.5},
        tree=TREE,
        classes=CLASSES,
        tenant_fields={
            **{k: {"parent": "team-many", "classes": ["interactive"]} for k in ("a1", "a2", "a3")},
            "solo": {"parent": "org-b"},
        },
    )
    yield gw
    gw.delete()


def admin(gw: Gateway, method: str, path: str, body: dict | None = None) -> httpx.Response:
    root = gw.base_url.removesuffix("/v1")
    return httpx.request(
        method, f"{root}/admin{path}", json=body, headers={"Authorization": f"Bearer {gw.admin_key}"}, timeout=30
    )


def node_service(gw: Gateway) -> dict[str, float]:
    rows = admin(gw, "GET", "/nodes").json()["data"]
    return {row["name"]: row.get("service", 0.0) for row in rows}


async def load(gw: Gateway, stop: asyncio.Event, failures: list) -> None:
    """Closed-loop clients on every key; solo's half interactive, half batch."""

    async def client(key: str, tier: str | None) -> None:
        c = openai.AsyncOpenAI(base_url=gw.base_url, api_key=gw.keys[key], max_retries=0, timeout=120)
        extra = {"ignore_eos": True} | ({"service_tier": tier} if tier else {})
        while not stop.is_set():
            try:
                await c.completions.create(model="fairgate-sim", prompt=PROMPT, max_tokens=MAX_TOKENS, extra_body=extra)
            except Exception as exc:  # asserted on: nothing may fail, the restart included
                failures.append((key, repr(exc)))
        await c.close()

    tasks = [
        asyncio.create_task(client(key, ("flex" if i % 2 else None) if key == "solo" else None))
        for key in KEYS
        for i in range(CLIENTS[key])
    ]
    await stop.wait()
    await asyncio.gather(*tasks)


async def shares(gw: Gateway, seconds: float) -> dict[str, float]:
    """Each node's share of the service delivered over the next ``seconds``."""
    before = await asyncio.to_thread(node_service, gw)
    await asyncio.sleep(seconds)
    after = await asyncio.to_thread(node_service, gw)
    grown = {n: after[n] - before.get(n, 0.0) for n in after}
    total = grown["org-a"] + grown["org-b"]
    return {n: v / total for n, v in grown.items()}


def test_tree_from_config_reweighted_live_and_kept_through_a_dispatcher_restart(tree_gateway):
    gw = tree_gateway
    actor = ray.get_actor(dispatcher_name(gw.name), namespace="fairgate")

    async def scenario():
        stop, failures = asyncio.Event(), []
        running = asyncio.create_task(load(gw, stop, failures))
        await asyncio.sleep(4.0)  # warm-up: every key backlogged
        even = await shares(gw, WINDOW_S)
        changed = await asyncio.to_thread(admin, gw, "PATCH", "/nodes/org-b", {"weight": 3})
        assert changed.status_code == 200, changed.text
        await asyncio.sleep(2.0)
        reweighted = await shares(gw, WINDOW_S)
        served_before = await asyncio.to_thread(node_service, gw)
        os.kill(ray.get(actor.process.remote())["pid"], signal.SIGKILL)  # Ray restarts it from Redis
        await asyncio.sleep(8.0)
        after_restart = await shares(gw, WINDOW_S)
        stop.set()
        await running
        return even, reweighted, served_before, after_restart, failures

    even, reweighted, served_before, after_restart, failures = asyncio.run(scenario())
    print(
        f"org-b share: {even['org-b']:.2f} at 1:1, {reweighted['org-b']:.2f} at 1:3, "
        f"{after_restart['org-b']:.2f} after restart"
    )
    assert not failures, failures[:3]
    # three keys earn org-a nothing over org-b's one: the organisations' weights decide
    assert 0.4 <= even["org-b"] <= 0.6
    # the reweight shows within the next window, and holds after the dispatcher restarted
    assert 0.65 <= reweighted["org-b"] <= 0.85
    assert 0.65 <= after_restart["org-b"] <= 0.85
    nodes = {row["name"]: row for row in admin(gw, "GET", "/nodes").json()["data"]}
    assert nodes["org-b"]["weight"] == 3 and nodes["team-many"]["parent"] == "org-a"
    assert nodes["org-b"]["service"] >= served_before["org-b"]  # counters continued, not reset
    tenants = {row["name"]: row for row in admin(gw, "GET", "/tenants").json()["data"]}
    assert tenants["solo"]["class_leaves"] == ["solo", "solo~batch"]  # its classes, weighted inside its node
    batch = ray.get(actor.stats.remote())["tenants"]["solo~batch"]
    assert batch["finished"] > 0  # never starved


def test_the_tier_served_is_echoed_and_a_class_a_key_may_not_use_is_refused(tree_gateway):
    gw = tree_gateway
    solo = openai.OpenAI(base_url=gw.base_url, api_key=gw.keys["solo"], max_retries=0, timeout=60)
    a1 = openai.OpenAI(base_url=gw.base_url, api_key=gw.keys["a1"], max_retries=0, timeout=60)
    flex = solo.completions.create(model="fairgate-sim", prompt="hi", max_tokens=4, extra_body={"service_tier": "flex"})
    assert flex.model_extra["service_tier"] == "flex"
    plain = solo.chat.completions.create(
        model="fairgate-sim", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert plain.service_tier == "default"
    chunks = list(
        solo.chat.completions.create(
            model="fairgate-sim",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            stream=True,
            service_tier="flex",
        )
    )
    assert chunks and all(c.service_tier == "flex" for c in chunks)
    for key, tier in ((a1, "flex"), (solo, "priority")):
        with pytest.raises(openai.BadRequestError) as err:
            key.completions.create(model="fairgate-sim", prompt="hi", max_tokens=4, extra_body={"service_tier": tier})
        assert err.value.body["param"] == "service_tier" and tier in err.value.body["message"]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "says"),
    [
        ("POST", "/nodes", {"name": "team-x", "parent": "nowhere"}, 400, "no tree node 'nowhere'"),
        ("PATCH", "/nodes/org-a", {"parent": "team-many"}, 400, "cycle"),
        ("POST", "/nodes", {"name": "team-y", "weight": 0}, 400, "weight"),
        ("PATCH", "/nodes/org-b", {"weight": -2}, 400, "weight"),
        ("POST", "/nodes", {"name": "org-a"}, 409, "already exists"),
        ("POST", "/nodes", {"name": "a1"}, 409, "is a tenant"),
        ("DELETE", "/nodes/team-many", None, 409, "still has members"),
        ("PATCH", "/tenants/a2", {"parent": "nowhere"}, 400, "no tree node 'nowhere'"),
        ("PATCH", "/tenants/a2", {"classes": ["gold"]}, 400, "no request class 'gold'"),
        ("POST", "/nodes", {"name": "team-z", "colour": "red"}, 400, "unknown field 'colour'"),
    ],
)
def test_bad_tree_changes_are_refused_clearly_and_change_nothing(tree_gateway, method, path, body, status, says):
    gw = tree_gateway
    before = admin(gw, "GET", "/nodes").json()["data"]
    tenants = admin(gw, "GET", "/tenants").json()["data"]
    r = admin(gw, method, path, body)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["message"]
    assert [(n["name"], n["parent"], n["weight"]) for n in admin(gw, "GET", "/nodes").json()["data"]] == [
        (n["name"], n["parent"], n["weight"]) for n in before
    ]
    assert [(t["name"], t["parent"]) for t in admin(gw, "GET", "/tenants").json()["data"]] == [
        (t["name"], t["parent"]) for t in tenants
    ]


def test_nodes_created_moved_and_deleted_live(tree_gateway):
    gw = tree_gateway
    assert admin(gw, "POST", "/nodes", {"name": "team-new", "parent": "org-b", "weight": 2}).status_code == 201
    created = admin(gw, "POST", "/tenants", {"name": "newkey", "parent": "team-new"})
    assert created.status_code == 201, created.text
    key = created.json()["api_key"]
    client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=60)
    client.completions.create(model="fairgate-sim", prompt="hi", max_tokens=4)
    moved = admin(gw, "PATCH", "/nodes/team-new", {"parent": "org-a"})
    assert moved.status_code == 200 and moved.json()["parent"] == "org-a"
    assert admin(gw, "PATCH", "/tenants/newkey", {"parent": ""}).json()["parent"] == ""
    assert admin(gw, "DELETE", "/nodes/team-new").status_code == 200
    assert "team-new" not in {n["name"] for n in admin(gw, "GET", "/nodes").json()["data"]}
    client.completions.create(model="fairgate-sim", prompt="hi", max_tokens=4)  # a root tenant now
    assert admin(gw, "DELETE", "/tenants/newkey").status_code == 200
    taken = admin(gw, "POST", "/nodes", {"name": "newkey"})  # its counters are kept under its name
    assert taken.status_code == 409 and "was a tenant" in taken.json()["error"]["message"]
    live = admin(gw, "GET", "/dashboard.json").json()  # the live page's data: the tree, per level
    assert {"org-a", "org-b", "team-many"} <= set(live["nodes"]) and "gap" in live["nodes"]["org-a"]
    samples = scrape(gw)  # promtool-clean, per-node series for the admin
    assert samples[("fairgate_node_weight", "org-b")] == live["nodes"]["org-b"]["weight"]
    assert ("fairgate_node_service_total", "team-many") in samples
    assert not any(label in ("org-a", "org-b") for _, label in scrape(gw, admin=False))  # no names for anyone else
