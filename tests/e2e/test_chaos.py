"""Chaos on real Ray, gRPC, HTTP and Redis while two tenants overload the gateway: the dispatcher actor's
process is killed (Ray restarts it; counters come back from Redis), then a worker replica's process,
then Redis itself (killed and started again on its data), then one of the two ingress replicas.

Every accepted request completes, or ends with a clear error when it was already streaming from the
worker (or through the ingress replica) that died; none is dropped silently, generated twice or
charged twice, and nothing stays reserved afterwards.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass

import openai
import psutil
import pytest
import ray
from ray import serve

from fairgate.dispatcher.actor import dispatcher_name
from tests.conftest import RedisServer
from tests.e2e.gateway_helpers import Gateway, clients, deploy
from tests.e2e.stream_clients import MAX_TOKENS, PROMPT, Outcomes, streaming_client

pytestmark = pytest.mark.slow

KV_PER_WORKER = 4000
U = max(60, 2 * 2 * KV_PER_WORKER)  # docs/architecture.md: max(w_p x longest prompt, w_q x KV pool of both workers)
SNAPSHOT_S = 0.5
MAX_RUNNING = 4


async def whole_client(client: openai.AsyncOpenAI, tenant: str, stop: asyncio.Event, out: Outcomes) -> None:
    while not stop.is_set():
        try:
            r = await client.completions.create(
                model="fairgate-sim", prompt=PROMPT, max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True}
            )
            out.completed.append((tenant, r.id, r.usage.completion_tokens))
        except openai.APIStatusError as exc:  # a 502 worker_failed: it had started on the dead worker
            out.failed.append((tenant, "", True, f"{exc.status_code} {exc.body}"))
        except Exception as exc:
            out.failed.append((tenant, "", False, repr(exc)))


def worker_infos(gw: Gateway) -> dict[str, dict]:
    """Each live worker replica's id, pid and the request ids it generated (asked through Serve)."""
    handle = serve.get_deployment_handle("WorkerReplica", gw.name)
    ids = {row["id"] for row in gw.stats()["workers"]}
    found: dict[str, dict] = {}
    for _ in range(60):
        info = handle.info.remote().result(timeout_s=30)
        found[info["worker_id"]] = info
        if ids <= set(found):
            break
    return found


def generated_counts(gw: Gateway) -> dict[str, int]:
    """How many times each request id was generated, over every live worker replica."""
    counts: dict[str, int] = {}
    for info in worker_infos(gw).values():
        for rid, n in info["generated"].items():
            counts[rid] = counts.get(rid, 0) + n
    return counts


def sample_gaps(gw: Gateway, stop: asyncio.Event, gaps: list[tuple[float, float, str]]):
    """Every 0.2 s: the counter gap between alice and bob while both are backlogged."""

    async def run() -> None:
        start = time.monotonic()
        while not stop.is_set():
            try:
                s = await asyncio.to_thread(gw.stats)
            except ray.exceptions.RayActorError:
                await asyncio.sleep(0.2)
                continue
            a, b = s["tenants"].get("alice"), s["tenants"].get("bob")
            if a and b and a["queued"] > 0 and b["queued"] > 0:
                gaps.append((time.monotonic() - start, abs(a["counter"] - b["counter"]), s["dispatcher_id"]))
            await asyncio.sleep(0.2)

    return run()


async def until_settled(gw: Gateway, timeout_s: float = 60.0) -> dict:
    """Wait until nothing is queued, in flight, pending or orphaned at the dispatcher."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = await asyncio.to_thread(gw.stats)
        busy = s["queue_depth"] + s["in_flight"] + s["pending_submits"] + s["orphans"]
        if busy == 0 or time.monotonic() > deadline:
            return s
        await asyncio.sleep(0.2)


@pytest.fixture(scope="module")
def chaos_redis(tmp_path_factory):
    """This module's own Redis (killed and started again by a test), persisting its data as on Kubernetes."""
    server = RedisServer(tmp_path_factory.mktemp("chaos-redis"), persist=True)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def chaos_gateway(serve_port, chaos_redis):
    gw = deploy(
        "chaos",
        serve_port,
        workers=2,
        kv_tokens=KV_PER_WORKER,
        step_s=0.02,  # slow enough that the pool, not this test's clients, is the bottleneck
        tenants=("alice", "bob"),
        max_running=MAX_RUNNING,
        state={"redis_url": chaos_redis.url, "snapshot_interval_s": SNAPSHOT_S},
        ingress_replicas=2,
    )
    yield gw
    gw.delete()


@dataclass
class Overload:
    """Both tenants flooding the chaos gateway (8 streaming and 4 whole-response clients each), with the
    counter gap between them sampled all along."""

    out: Outcomes
    gaps: list[tuple[float, float, str]]
    stop: asyncio.Event
    tasks: list[asyncio.Task]

    @classmethod
    async def start(cls, gw: Gateway, warmup_s: float = 4.0) -> Overload:
        out, gaps, stop = Outcomes(), [], asyncio.Event()
        c = clients(gw)
        tasks = [asyncio.create_task(sample_gaps(gw, stop, gaps))]
        for tenant in ("alice", "bob"):
            tasks += [asyncio.create_task(streaming_client(c[tenant], tenant, stop, out)) for _ in range(8)]
            tasks += [asyncio.create_task(whole_client(c[tenant], tenant, stop, out)) for _ in range(4)]
        await asyncio.sleep(warmup_s)
        return cls(out, gaps, stop, tasks)

    async def end(self, gw: Gateway) -> dict:
        """Stop the clients; returns the dispatcher's stats once it holds nothing more."""
        self.stop.set()
        await asyncio.gather(*self.tasks)
        return await until_settled(gw)


def test_killing_the_dispatcher_process_loses_nothing_and_counters_continue(chaos_gateway):
    gw = chaos_gateway
    actor = ray.get_actor(dispatcher_name(gw.name), namespace="fairgate")

    async def scenario():
        load = await Overload.start(gw)
        before = await asyncio.to_thread(gw.stats)
        pid = (await actor.process.remote())["pid"]
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        while True:  # Ray restarts the actor; it restores its counters from Redis
            try:
                after = await asyncio.to_thread(gw.stats)
                if after["dispatcher_id"] != before["dispatcher_id"]:
                    break
            except ray.exceptions.RayActorError:
                pass
            await asyncio.sleep(0.2)
        restarted_in = time.monotonic() - killed_at
        await asyncio.sleep(6.0)
        end = await load.end(gw)
        return load.out, load.gaps, before, after, restarted_in, end

    out, gaps, before, after, restarted_in, end = asyncio.run(scenario())
    print(f"dispatcher restarted in {restarted_in:.1f} s; {len(out.completed)} requests completed")
    assert not out.failed, out.failed[:5]
    assert all(tokens == MAX_TOKENS for _, _, tokens in out.completed)
    # never generated twice: every completed request ran exactly once on the (untouched) workers
    generated = generated_counts(gw)
    assert all(generated.get(rid) == 1 for _, rid, _ in out.completed)
    assert max(generated.values()) == 1
    # the counters continue from the snapshot: right after the restart they are where they were
    # (at most a snapshot interval's service lost), not zero
    rate = {t: before["tenants"][t]["service"] / 4.0 for t in ("alice", "bob")}
    for t in ("alice", "bob"):
        assert after["tenants"][t]["service"] >= before["tenants"][t]["service"] - rate[t] * (SNAPSHOT_S + 0.5)
        assert end["tenants"][t]["service"] > after["tenants"][t]["service"]
    # fairness over the whole run, across the restart
    slack = max(rate.values()) * SNAPSHOT_S
    worst = max(g for _, g, _ in gaps)
    print(f"largest counter gap {worst:.0f} (2U = {2 * U}, snapshot slack {slack:.0f}) over {len(gaps)} samples")
    assert len({d for *_, d in gaps}) == 2, "samples before and after the restart"
    assert worst <= 2 * U + slack
    assert end["queue_depth"] == end["in_flight"] == end["pending_submits"] == end["orphans"] == 0


def _worker_pid(address: str) -> int:
    port = int(address.rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return conn.pid
    raise AssertionError(f"no process listens on {address}")


def test_killing_a_worker_process_requeues_unstarted_requests_and_ends_streaming_ones_clearly(chaos_gateway):
    gw = chaos_gateway

    async def scenario():
        load = await Overload.start(gw)
        stats = await asyncio.to_thread(gw.stats)
        victim = stats["workers"][0]
        survivor = stats["workers"][1]["id"]
        os.kill(_worker_pid(victim["address"]), signal.SIGKILL)
        await asyncio.sleep(8.0)
        return load.out, load.gaps, victim, survivor, await load.end(gw)

    out, gaps, victim, survivor, end = asyncio.run(scenario())
    print(f"{len(out.completed)} completed, {len(out.failed)} ended with an error (victim ran {victim['running']})")
    assert all(tokens == MAX_TOKENS for _, _, tokens in out.completed)
    # only requests already streaming from the dead worker fail, each with the worker_failed error
    assert all(streamed and "worker" in error for _, _, streamed, error in out.failed), out.failed
    assert len(out.failed) <= MAX_RUNNING
    # none generated twice on the workers that lived through it
    infos = worker_infos(gw)
    assert survivor in infos
    assert all(n == 1 for n in infos[survivor]["generated"].values())
    worst = max(g for _, g, _ in gaps)
    print(f"largest counter gap {worst:.0f} (2U = {2 * U}) over {len(gaps)} samples")
    assert worst <= 2 * U
    assert end["queue_depth"] == end["in_flight"] == end["pending_submits"] == end["orphans"] == 0
    assert victim["id"] not in {w["id"] for w in end["workers"]}


COST = 60 + 2 * MAX_TOKENS  # one request of the overload: 60 prompt tokens, 40 output (w_p 1, w_q 2)
CACHED_DISCOUNT = 1.0 - 0.1  # w_p - w_c: what a prompt token found in the engine's prefix cache costs less


def cache_discount(start: dict, end: dict, tenant: str) -> float:
    """What ``tenant``'s requests between two stats paid less for their cached prompt tokens."""
    return CACHED_DISCOUNT * (end["tenants"][tenant]["cached_tokens"] - start["tenants"][tenant]["cached_tokens"])


def test_killing_redis_under_load_loses_nothing_charges_once_and_state_resumes(chaos_gateway, chaos_redis):
    from fairgate.dispatcher.state_store import RedisStore

    gw = chaos_gateway

    async def scenario():
        start = await until_settled(gw)
        load = await Overload.start(gw, warmup_s=2.0)
        chaos_redis.kill()  # the dispatcher serves on; its snapshots fail meanwhile
        await asyncio.sleep(3.0)
        without = await asyncio.to_thread(gw.stats)
        chaos_redis.start()  # on its append-only file: what it held is back
        await asyncio.sleep(3.0)
        end = await load.end(gw)
        await asyncio.sleep(3 * SNAPSHOT_S)  # a snapshot after the last request
        return load.out, start, without, end

    out, start, without, end = asyncio.run(scenario())
    print(f"{len(out.completed)} completed with Redis down for 3 s of the run")
    assert not out.failed, out.failed[:5]
    assert all(tokens == MAX_TOKENS for _, _, tokens in out.completed)
    finished = [sum(t["finished"] for t in stats["tenants"].values()) for stats in (start, without)]
    assert finished[1] > finished[0]  # served on without Redis
    generated = generated_counts(gw)
    assert all(generated.get(rid) == 1 for _, rid, _ in out.completed)
    for t in ("alice", "bob"):  # every request charged exactly once
        completed = sum(1 for tenant, *_ in out.completed if tenant == t)
        charged = end["tenants"][t]["service"] - start["tenants"][t]["service"]
        assert charged == pytest.approx(completed * COST - cache_discount(start, end, t))

    async def saved_state():  # its base and journal, as a restart reads them
        store = RedisStore(chaos_redis.url, f"fairgate:{gw.name}")
        try:
            return await store.load_state()
        finally:
            await store.close()

    saved = asyncio.run(saved_state())
    rows = {row["name"]: row for row in saved["tenants"]}  # the writes resumed once Redis was back
    for t in ("alice", "bob"):
        assert rows[t]["service"] == pytest.approx(end["tenants"][t]["service"])
    assert end["queue_depth"] == end["in_flight"] == end["pending_submits"] == end["orphans"] == 0


def _ingress_pids(app: str) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any(f"ServeReplica:{app}:Ingress" in part for part in (p.info["cmdline"] or []))
    ]


def test_killing_an_ingress_replica_fails_only_its_own_requests_and_leaks_no_reservation(chaos_gateway):
    gw = chaos_gateway
    pids = _ingress_pids(gw.name)
    assert len(pids) == 2, pids

    async def scenario():
        start = await until_settled(gw)
        load = await Overload.start(gw, warmup_s=2.0)
        os.kill(pids[0], signal.SIGKILL)
        await asyncio.sleep(6.0)  # the other replica serves on; Serve starts a new one
        await load.end(gw)
        return load.out, start, await until_settled(gw, timeout_s=120.0)  # its tickets expire in 30 s

    out, start, end = asyncio.run(scenario())
    print(f"{len(out.completed)} completed, {len(out.failed)} failed with the killed ingress replica")
    assert all(tokens == MAX_TOKENS for _, _, tokens in out.completed)
    # the requests routed to the dead replica (until Serve's health check takes it out) fail with a
    # server error; the other replica's went on
    assert len(out.completed) > len(out.failed)
    assert all("500" in error or "Connection" in error or "Error code: 5" in error for *_, error in out.failed), (
        out.failed
    )
    generated = generated_counts(gw)
    assert all(generated.get(rid) == 1 for _, rid, _ in out.completed)
    # what the dead replica had queued or assigned is freed: by the abort of its worker calls, or by the
    # expiry of its tickets; nothing stays held
    assert end["queue_depth"] == end["in_flight"] == end["pending_submits"] == end["orphans"] == 0
    assert all(w["committed"] == 0 for w in end["workers"])
    for t in ("alice", "bob"):  # charged for what was served, no more
        completed = sum(1 for tenant, *_ in out.completed if tenant == t)
        failed = sum(1 for tenant, *_ in out.failed if tenant == t)
        charged = end["tenants"][t]["service"] - start["tenants"][t]["service"]
        assert completed * COST - cache_discount(start, end, t) - 1e-6 <= charged <= (completed + failed) * COST + 1e-6


def test_tenants_changed_through_the_admin_api_survive_a_dispatcher_restart(chaos_gateway):
    import httpx

    gw = chaos_gateway
    root = gw.base_url.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {gw.admin_key}"}
    created = httpx.post(f"{root}/admin/tenants", json={"name": "dave", "weight": 2}, headers=headers, timeout=30)
    assert created.status_code == 201, created.text
    dave = openai.OpenAI(base_url=gw.base_url, api_key=created.json()["api_key"], max_retries=0, timeout=60)
    dave.completions.create(model="fairgate-sim", prompt="hi", max_tokens=5, extra_body={"ignore_eos": True})
    assert httpx.patch(f"{root}/admin/tenants/bob", json={"weight": 3}, headers=headers, timeout=30).status_code == 200
    actor = ray.get_actor(dispatcher_name(gw.name), namespace="fairgate")
    served = ray.get(actor.stats.remote())["tenants"]["dave"]["service"]
    time.sleep(2 * SNAPSHOT_S)  # one snapshot after the request
    os.kill(ray.get(actor.process.remote())["pid"], signal.SIGKILL)
    rows = None
    for _ in range(300):
        try:
            rows = {row["name"]: row for row in ray.get(actor.list_tenants.remote())}
            break
        except ray.exceptions.RayActorError:
            time.sleep(0.1)
    assert rows is not None
    assert rows["dave"]["weight"] == 2 and rows["bob"]["weight"] == 3
    assert rows["dave"]["service"] == pytest.approx(served)
    dave.completions.create(model="fairgate-sim", prompt="hi", max_tokens=5, extra_body={"ignore_eos": True})


def test_a_dispatcher_whose_start_failed_tries_again_on_the_next_call(serve_port, tmp_path):
    """Redis is not up when the dispatcher starts: that call fails clearly, and once Redis answers the
    next call starts the dispatcher (a failed start is never kept)."""
    from fairgate.dispatcher.actor import get_or_create_dispatcher
    from fairgate.gateway.config import deployable, parse_config

    redis_later = RedisServer(tmp_path, start=False)
    raw = {
        "tenants": [{"name": "alice", "api_key": "alice-key-" + "a" * 16}],
        "admin_api_key": "fg-admin-" + "x" * 20,
        "state": {"redis_url": redis_later.url, "connect_timeout_s": 0.5},
    }
    secret = "secret-for-this-test-" + "s" * 16
    actor = get_or_create_dispatcher("start-retry", deployable(parse_config(raw)[0], secret), secret)
    try:
        with pytest.raises(ray.exceptions.RayTaskError, match="Redis did not answer"):
            ray.get(actor.stats.remote())
        redis_later.start()
        assert "alice" in ray.get(actor.stats.remote())["tenants"]
    finally:
        ray.kill(actor)
        redis_later.stop()
