"""Two dispatcher shards on real Ray, gRPC, HTTP and Redis (docs/shards.md): two ingress replicas, two
workers (one per shard), two tenants. alice's requests all come through one ingress replica (so they
reach one shard), bob's through both. Both tenants' shares stay within the fleet's bound, and alice is
served by both shards' workers (the rounds deal her waiting requests). Then a shard's process (or
the rounds' runner's) is SIGKILLed under the flood: no client sees an error, and every tenant's
charges, once the shards agree again, are exactly what its clients were served: none lost, none
counted twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from dataclasses import dataclass, field

import httpx
import openai
import pytest
import ray

from fairgate.dispatcher.actor import dispatcher_name
from fairgate.dispatcher.names import rounds_name
from fairgate.ingress.deployment import SHARD_HEADER
from tests.conftest import RedisServer
from tests.e2e.gateway_helpers import Gateway, deploy, scrape

pytestmark = pytest.mark.slow

KV_PER_WORKER = 4000
MAX_RUNNING = 4
PROMPT_TOKENS, MAX_TOKENS = 60, 40
COST = PROMPT_TOKENS * 1.0 + MAX_TOKENS * 2.0  # each request's, at the default linear cost (w_p 1, w_q 2)
U = max(PROMPT_TOKENS, 2 * 2 * KV_PER_WORKER)  # docs/architecture.md, as in the chaos test
TAU_S = 0.05


@dataclass
class Flood:
    served: dict[str, int] = field(default_factory=dict)  # tenant -> requests completed whole
    shards: dict[str, set[str]] = field(default_factory=dict)  # tenant -> the shards that placed its requests
    failed: list[str] = field(default_factory=list)


def unique_prompt() -> str:
    """60 prompt tokens no other request shares (no cached prefix: each request costs exactly COST)."""
    return uuid.uuid4().hex + " " + "word " * (PROMPT_TOKENS - 1)


async def one_request(client: openai.AsyncOpenAI, tenant: str, out: Flood) -> str:
    """One streamed request, whole; returns the shard that placed it ("" when it failed)."""
    try:
        raw = await client.completions.with_raw_response.create(
            model="fairgate-sim",
            prompt=unique_prompt(),
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        tokens = 0
        async for chunk in raw.parse():
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        assert tokens == MAX_TOKENS, tokens
        out.served[tenant] = out.served.get(tenant, 0) + 1
        out.shards.setdefault(tenant, set()).add(raw.headers[SHARD_HEADER])
        return raw.headers[SHARD_HEADER]
    except Exception as exc:
        out.failed.append(f"{tenant}: {exc!r}")
        return ""


async def closed_loop(client: openai.AsyncOpenAI, tenant: str, stop: asyncio.Event, out: Flood) -> None:
    while not stop.is_set():
        await one_request(client, tenant, out)


def one_connection_client(gw: Gateway, tenant: str) -> openai.AsyncOpenAI:
    """A client on one kept-alive connection: every request it sends reaches the same ingress replica."""
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1), timeout=120)
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key=gw.keys[tenant], max_retries=0, http_client=http)


async def clients_on_shard(gw: Gateway, tenant: str, shard: str, count: int, out: Flood) -> list[openai.AsyncOpenAI]:
    """``count`` one-connection clients whose ingress replica submits to ``shard`` (told by a first
    request's shard header, while nothing waits and so nothing is dealt elsewhere; counted in ``out``)."""
    kept: list[openai.AsyncOpenAI] = []
    for _ in range(40 * count):
        client = one_connection_client(gw, tenant)
        placed = await one_request(client, tenant, out)
        assert not out.failed, out.failed
        if placed == shard:
            kept.append(client)
            if len(kept) == count:
                return kept
        else:
            await client.close()
    raise AssertionError(f"no {count} connections reached an ingress replica of shard {shard}")


def both_stats(gw: Gateway) -> list[dict]:
    return [gw.stats(shard=k) for k in range(2)]


async def settled(gw: Gateway, timeout_s: float = 60.0) -> list[dict]:
    """Both shards once nothing waits or runs anywhere and their figures agree (rounds went through)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = await asyncio.to_thread(both_stats, gw)
        busy = sum(s["queue_depth"] + s["in_flight"] + s["pending_submits"] + s["orphans"] for s in stats)
        agree = all(
            abs(stats[0]["tenants"][t]["service"] - stats[1]["tenants"][t]["service"]) < 1e-6 for t in ("alice", "bob")
        )
        if (busy == 0 and agree) or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.2)


@pytest.fixture(scope="module")
def shard_redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("shard-redis"), persist=True)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sharded(serve_port, shard_redis):
    gw = deploy(
        "shards",
        serve_port,
        workers=2,
        kv_tokens=KV_PER_WORKER,
        step_s=0.02,
        tenants=("alice", "bob"),
        max_running=MAX_RUNNING,
        engine_queue=0,
        state={"redis_url": shard_redis.url, "snapshot_interval_s": 0.5},
        ingress_replicas=2,
        shards={"count": 2, "tau_s": TAU_S},
    )
    yield gw
    gw.delete()


def sample_gaps(gw: Gateway, stop: asyncio.Event, gaps: list[float]):
    """Every 0.2 s, while both tenants wait somewhere in the fleet: the service gap, by shard 0's figures."""

    async def run() -> None:
        while not stop.is_set():
            try:
                stats = await asyncio.to_thread(both_stats, gw)
            except ray.exceptions.RayActorError:  # a shard restarting
                await asyncio.sleep(0.2)
                continue
            waiting = {t: sum(s["tenants"][t]["queued"] for s in stats) for t in ("alice", "bob")}
            if all(waiting.values()):
                tenants = stats[0]["tenants"]
                gaps.append(abs(tenants["alice"]["service"] - tenants["bob"]["service"]))
            await asyncio.sleep(0.2)

    return run()


async def flood(gw: Gateway, seconds: float, during=None) -> tuple[Flood, list[float]]:
    """alice through one ingress replica (shard 0's), bob through both; ``during``: a coroutine run
    once the flood is on."""
    out, gaps, stop = Flood(), [], asyncio.Event()
    alice = await clients_on_shard(gw, "alice", "0", 6, out)
    out.shards.clear()
    bob = [openai.AsyncOpenAI(base_url=gw.base_url, api_key=gw.keys["bob"], max_retries=0, timeout=120)]
    tasks = [asyncio.create_task(sample_gaps(gw, stop, gaps))]
    tasks += [asyncio.create_task(closed_loop(c, "alice", stop, out)) for c in alice]
    tasks += [asyncio.create_task(closed_loop(bob[0], "bob", stop, out)) for _ in range(6)]
    if during is not None:
        await asyncio.sleep(3.0)
        await during()
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks)
    for c in alice + bob:
        await c.close()
    return out, gaps


def test_skewed_ingress_both_shards_serve_alice_and_shares_stay_within_the_fleet_bound(sharded):
    gw = sharded
    before = [s["tenants"] for s in both_stats(gw)]
    out, gaps = asyncio.run(flood(gw, 8.0))
    assert not out.failed, out.failed[:5]
    assert out.shards["alice"] == {"0", "1"}, "alice's waiting requests were dealt to the other shard"
    rate = sum(out.served.values()) * COST / 8.0
    bound = 2 * U + 2 * rate * TAU_S  # fairgate.core.shards.sharded_bound, the fleet's rate at its most
    print(f"largest gap {max(gaps):.0f} over {len(gaps)} samples (bound {bound:.0f}); served {out.served}")
    assert gaps and max(gaps) <= bound
    after = asyncio.run(settled(gw))
    for tenant, n in out.served.items():
        charged = [s["tenants"][tenant]["service"] - b[tenant]["service"] for s, b in zip(after, before, strict=True)]
        assert charged[0] == pytest.approx(n * COST), (tenant, charged, n)  # every request charged once
        assert charged[1] == pytest.approx(charged[0])  # both shards hold the fleet's figures
    # the live page and /metrics show each shard, the rounds and the fleet's bound
    page = httpx.get(
        gw.base_url.removesuffix("/v1") + "/admin/dashboard.json",
        headers={"Authorization": f"Bearer {gw.admin_key}"},
        timeout=30,
    ).json()
    assert [(r["shard"], r["workers"]) for r in page["shards"]] == [(0, 1), (1, 1)]
    assert page["rounds"]["rounds"] > 0 and page["rounds"]["dealt"] > 0
    assert len(page["workers"]) == 2 and max(gaps) <= page["fleet_bound"]
    metrics = scrape(gw)
    assert metrics[("fairgate_shard_workers", "0")] == metrics[("fairgate_shard_workers", "1")] == 1
    assert metrics[("fairgate_shard_requests_dealt_total", "")] > 0
    assert metrics[("fairgate_fairness_bound_fleet", "")] >= metrics[("fairgate_fairness_bound_2u", "")] > 0


@pytest.mark.parametrize("victim", ["shard 1", "shard 0", "the rounds' runner"])
def test_a_process_killed_under_the_flood_loses_no_request_and_no_charge(sharded, victim):
    """Shard 1 (a plain shard), shard 0 (the one the admin API and the live page ask) or the rounds'
    runner (which keeps the fleet's figures in memory only) SIGKILLed under the flood."""
    gw = sharded
    stats = both_stats(gw)
    before, lives = [s["tenants"] for s in stats], [s["dispatcher_id"] for s in stats]
    if victim == "the rounds' runner":
        actor = ray.get_actor(rounds_name(gw.name), namespace="fairgate")
    else:
        actor = ray.get_actor(dispatcher_name(gw.name, int(victim[-1])), namespace="fairgate")
    killed = {}

    async def kill() -> None:
        pid = (await actor.process.remote())["pid"]
        os.kill(pid, signal.SIGKILL)
        killed["pid"] = pid

    out, _ = asyncio.run(flood(gw, 8.0, during=kill))
    assert killed
    assert not out.failed, out.failed[:5]
    after = asyncio.run(settled(gw))
    if victim != "the rounds' runner":  # the shard restarted, from its durable state in Redis
        assert after[int(victim[-1])]["dispatcher_id"] != lives[int(victim[-1])]
    else:
        assert ray.get(actor.process.remote())["pid"] != killed["pid"]
    for tenant, n in out.served.items():
        charged = [s["tenants"][tenant]["service"] - b[tenant]["service"] for s, b in zip(after, before, strict=True)]
        print(f"{victim} killed; {tenant}: {n} requests served, charged {charged} (exact {n * COST})")
        assert charged[0] == pytest.approx(n * COST), (tenant, charged, n)
        assert charged[1] == pytest.approx(charged[0])
