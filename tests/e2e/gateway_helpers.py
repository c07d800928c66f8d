"""Deploying gateway applications on the session's Serve instance, for end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import ray
from prometheus_client.parser import text_string_to_metric_families
from ray import serve
from ray.serve import api as serve_api

from fairgate.common.config import GatewayConfig
from fairgate.common.loopback import front_door
from fairgate.core import LinearCost
from fairgate.dispatcher.actor import dispatcher_name
from fairgate.dispatcher.names import rounds_name
from fairgate.gateway.app import build_app, wait_until_routed
from fairgate.gateway.config import parse_config
from tests.conftest import free_port


@dataclass
class Gateway:
    """A deployed gateway. ``base_url`` is its front door's (the direct one by default: the ingress
    replicas' own server on a port of this gateway's); ``proxied_url`` reaches the same application
    through Serve's own front door (the session's, under the route prefix ``/<name>``)."""

    name: str
    base_url: str
    keys: dict[str, str]
    config: GatewayConfig
    secret: str
    raw: dict[str, Any]
    admin_key: str = ""
    listen: str | None = None
    proxied_url: str = ""

    def stats(self, model: str | None = None, shard: int = 0) -> dict[str, Any]:
        """The dispatcher's (``shard``'s) stats of one model pool (None: the first model's)."""
        actor = ray.get_actor(dispatcher_name(self.name, shard), namespace="fairgate")
        return ray.get(actor.stats.remote(model))

    def redeploy(self, workers: int) -> None:
        raw = dict(self.raw, workers={**self.raw["workers"], "count": workers})
        config, _ = parse_config(raw)
        app = build_app(self.name, config, self.secret, self.listen)
        serve.run(app, name=self.name, route_prefix=f"/{self.name}")

    def delete(self) -> None:
        """Remove the application; its replicas finish shutting down while the next test starts (each
        gateway's own names and ports, so nothing of it is reused)."""
        serve.delete(self.name, _blocking=False)
        names = [dispatcher_name(self.name, k) for k in range(self.config.shards.count)] + [rounds_name(self.name)]
        for name in names:
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(name, namespace="fairgate"))


def start_deploy(
    name: str,
    port: int,
    *,
    policy: str = "vtc",
    workers: int = 2,
    kv_tokens: int = 4000,
    step_s: float = 0.01,
    tenants: tuple[str, ...] = ("alice", "bob", "carol"),
    max_body_bytes: int = 65536,
    max_model_len: int = 4096,
    vllm: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
    state: dict[str, Any] | None = None,
    max_running: int | None = None,
    autoscaling: dict[str, Any] | None = None,
    telemetry: dict[str, Any] | None = None,
    ingress_replicas: int = 1,
    models: list[dict[str, Any]] | None = None,
    placement: str = "most-room",
    cache_groups: dict[str, str] | None = None,
    tree: list[dict[str, Any]] | None = None,
    classes: list[dict[str, Any]] | None = None,
    tenant_fields: dict[str, dict[str, Any]] | None = None,
    engine_queue: int = 8,
    ingress: dict[str, Any] | None = None,
    quotas: list[dict[str, Any]] | None = None,
    revoke: bool = False,
    adapters: list[dict[str, Any]] | None = None,
    max_loras: int | None = None,
    shards: dict[str, Any] | None = None,
) -> Deploying:
    """Send Serve a gateway and return while it starts (``.ready()`` waits for it): a module needing
    several vLLM gateways starts them at once (an engine takes ~45 s to start here, most of it one
    process importing at a time).

    A gateway with simulated workers (constant step time), or vLLM workers when ``vllm`` is given.
    ``models``: several pools instead, each ``{name, tenants, workers}`` whose workers update the
    simulated ones above. ``cache_groups``: tenant -> the group whose cached prefixes it shares.
    ``tree`` / ``classes``: the tenant tree and request classes; ``tenant_fields``: tenant -> more of
    its configuration (``parent``, ``classes``). ``engine_queue``: requests that may wait inside an
    engine beyond its room (0, with ``max_running``, keeps every choice in the dispatcher's queue).
    ``ingress``: more of the ingress section; ``quotas``: token quotas; ``revoke``: revocation by
    over-service; ``adapters``: LoRA adapters, on workers with ``max_loras`` slots (simulated ones:
    vLLM's are in ``vllm``). ``shards``: the dispatcher's shards (``count``, ``tau_s``)."""
    keys = {t: "fg-test-" + secrets.token_hex(12) for t in tenants}
    admin_key = "fg-admin-test-" + secrets.token_hex(12)
    engine = {"engine": "vllm", "vllm": vllm} if vllm is not None else {}
    raw = {
        "model": vllm["model"] if vllm is not None else "fairgate-sim",
        "policy": policy,
        "placement": placement,
        "max_engine_waiting": engine_queue,
        "limits": limits or {},
        "state": state or {},
        "telemetry": telemetry or {},
        "workers": {
            **engine,
            "count": workers,
            "max_running": max_running,
            "autoscaling": autoscaling,
            "graceful_shutdown_s": 30,
            "kv_tokens": kv_tokens,
            "block_size": 1,
            "step_model": {
                "step_overhead_s": step_s,
                "prefill_per_token_s": 0.0,
                "decode_per_seq_s": 0.0,
                "decode_per_ctx_token_s": 0.0,
            },
        },
        "ingress": {
            "replicas": ingress_replicas,
            "max_body_bytes": max_body_bytes,
            "max_model_len": max_model_len,
            "default_max_tokens": 16,
            **(ingress or {}),
        },
        "tenants": [
            {"name": t, "api_key": k, "cache_group": (cache_groups or {}).get(t), **(tenant_fields or {}).get(t, {})}
            for t, k in keys.items()
        ],
        "admin_api_key": admin_key,
    }
    if tree is not None:
        raw["tree"] = tree
    if quotas is not None:
        raw["quotas"] = quotas
    raw["revoke"] = revoke  # off unless asked (the deployment's default is on): each test says which it runs
    if adapters is not None:
        raw["adapters"] = adapters
    if max_loras is not None:
        raw["workers"]["max_loras"] = max_loras
    if classes is not None:
        raw["classes"] = classes
    if shards is not None:
        raw["shards"] = shards
    if models is not None:
        base = raw.pop("workers")
        del raw["model"]
        raw["models"] = [{**m, "workers": {**base, **m.get("workers", {})}} for m in models]
    config, _ = parse_config(raw)
    secret = secrets.token_hex(16)
    listen = f"127.0.0.1:{free_port()}" if front_door() == "direct" else None
    serve_api._run(build_app(name, config, secret, listen), _blocking=False, name=name, route_prefix=f"/{name}")
    proxied = f"http://127.0.0.1:{port}/{name}"
    base = f"http://{listen}" if listen else proxied
    return Deploying(Gateway(name, base + "/v1", keys, config, secret, raw, admin_key, listen, proxied + "/v1"))


def deploy(name: str, port: int, **options: Any) -> Gateway:
    """A gateway (see ``start_deploy``), once it serves."""
    return start_deploy(name, port, **options).ready()


@dataclass
class Deploying:
    """A gateway Serve is starting."""

    gateway: Gateway

    def ready(self, timeout_s: float = 600.0) -> Gateway:
        """The gateway once every deployment of its application runs and both front doors route to it."""
        name = self.gateway.name
        deadline = time.monotonic() + timeout_s
        while True:
            app = serve.status().applications.get(name)
            status = app.status if app is not None else "NOT_STARTED"
            if status == "RUNNING":
                break
            if status == "DEPLOY_FAILED" or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway {name} did not start ({status}): {app.message if app else ''}")
            time.sleep(1.0)  # a status costs the caller ~30 ms of CPU, and Serve's controller more
        wait_until_routed(self.gateway.base_url.removesuffix("/v1"))
        wait_until_routed(self.gateway.proxied_url.removesuffix("/v1"))
        return self.gateway


def holds_nothing(gw: Gateway, tenant: str, within_s: float = 15.0) -> dict[str, Any]:
    """The dispatcher's view once ``tenant``'s requests are settled: nothing queued, assigned or
    reserved for it, every step report of what it ran received (a client can read an answer's end a
    few milliseconds before its last report arrives; abandoned requests settle well before a ticket's
    30 s expiry would free them)."""
    deadline = time.monotonic() + within_s
    while True:
        stats = gw.stats()
        row = stats["tenants"][tenant]
        if (row["in_flight"], row["queued"]) == (0, 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


# ----------------------------------------------------------------------------- load

PROMPT = "word " * 60  # 60 prompt tokens for the simulated tokenizer
MAX_TOKENS = 40


def clients(gw: Gateway) -> dict[str, openai.AsyncOpenAI]:
    return {
        t: openai.AsyncOpenAI(base_url=gw.base_url, api_key=k, max_retries=0, timeout=120) for t, k in gw.keys.items()
    }


async def closed_loop(
    client: openai.AsyncOpenAI, model: str, stop: asyncio.Event, results: list, ends: list | None = None
) -> None:
    """One client sending the next request as soon as the previous one ends (``ends``, if given: when
    each ended, and its usage)."""
    while not stop.is_set():
        try:
            r = await client.completions.create(
                model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True}
            )
            results.append(r.usage.completion_tokens)
            if ends is not None:
                ends.append((time.monotonic(), r.usage))
        except Exception as exc:  # recorded and asserted on: nothing may fail
            results.append(exc)


async def light_probe(client: openai.AsyncOpenAI, model: str, stop: asyncio.Event, ttfts: list[float]) -> None:
    """A light tenant: one short streaming request at a time, now and then; records first-token latency."""
    while not stop.is_set():
        start = time.monotonic()
        stream = await client.completions.create(
            model=model, prompt="hi", max_tokens=2, stream=True, extra_body={"ignore_eos": True}
        )
        first = None
        async for _ in stream:
            if first is None:
                first = time.monotonic() - start
        ttfts.append(first)
        await asyncio.sleep(0.5)


def backlogged(stats: dict, tenants: Iterable[str]) -> bool:
    """Whether each of ``tenants`` had requests waiting in the dispatcher when ``stats`` was taken."""
    return all(stats["tenants"][t]["queued"] > 0 for t in tenants)


async def stats_when_backlogged(stats: Callable[[], dict], tenants: Iterable[str], within_s: float = 10.0) -> dict:
    """``stats()`` taken at a moment when every one of ``tenants`` has requests waiting, retaken for up
    to ``within_s``: a closed loop's tenant may have all its requests running for an instant, and a
    window of service measured between such moments would not be one of contention. Returns the last
    taken (a caller asserts ``backlogged``)."""
    tenants = list(tenants)
    deadline = time.monotonic() + within_s
    while not backlogged(taken := await asyncio.to_thread(stats), tenants) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return taken


async def _flood(
    c: dict[str, openai.AsyncOpenAI], probe: openai.AsyncOpenAI, model: str, seconds: float, load: dict[str, int],
    warmup_s: float, mark: Callable[[], Awaitable[Any]],
) -> tuple[Any, Any, list[float], list, dict[str, list]]:  # fmt: skip
    """Heavy tenants in closed loops (``load``: tenant -> clients) and a light probe; ``mark()`` taken
    after the warm-up and once more ``seconds`` later. Returns both marks, the probe's first-token
    latencies, every heavy result, and each heavy tenant's ends (when, usage)."""
    stop = asyncio.Event()
    results: list = []
    ttfts: list[float] = []
    ends: dict[str, list] = {t: [] for t in load}
    tasks = [
        asyncio.create_task(closed_loop(c[t], model, stop, results, ends[t])) for t, n in load.items() for _ in range(n)
    ]
    tasks.append(asyncio.create_task(light_probe(probe, model, stop, ttfts)))
    await asyncio.sleep(warmup_s)  # until the heavy tenants are backlogged
    first = await mark()
    await asyncio.sleep(seconds)
    last = await mark()
    stop.set()
    await asyncio.gather(*tasks)
    return first, last, ttfts, results, ends


async def overload(gw: Gateway, seconds: float, load: dict[str, int], warmup_s: float = 3.0):
    """Heavy tenants in closed loops (``load``: tenant -> clients) and carol as a light probe. Returns
    (service of each heavy tenant between two moments when all were backlogged, carol's first-token
    latencies, every heavy result)."""
    c = clients(gw)

    async def mark() -> dict:
        return await stats_when_backlogged(gw.stats, load)

    first, last, ttfts, results, _ = await _flood(c, c["carol"], gw.config.model, seconds, load, warmup_s, mark)
    assert backlogged(first, load) and backlogged(last, load), (first["tenants"], last["tenants"])
    got = {t: last["tenants"][t]["service"] - first["tenants"][t]["service"] for t in load}
    return got, ttfts, results


async def overload_engine_alone(base_url: str, model: str, seconds: float, load: dict[str, int], warmup_s: float):
    """The same load against an engine's own server, which knows no tenants: each heavy tenant's service
    counted by its own clients (the default linear cost of the requests that ended inside the window).
    Returns what ``overload`` returns."""
    c = {t: openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120) for t in [*load, ""]}

    async def mark() -> float:
        return time.monotonic()

    first, last, ttfts, results, ends = await _flood(c, c[""], model, seconds, load, warmup_s, mark)
    cost = LinearCost()
    got = {
        t: sum(cost.total(u.prompt_tokens, u.completion_tokens) for at, u in e if first < at <= last)
        for t, e in ends.items()
    }
    return got, ttfts, results


LABELS = ("tenant", "worker", "node", "shard")  # what names a sample in ``scrape``'s answer


def scrape(gw: Gateway, admin: bool = True) -> dict[tuple[str, str], float]:
    """The samples of one scrape of ``/metrics``, which must pass Prometheus's own ``promtool check
    metrics`` without a warning."""
    headers = {"Authorization": f"Bearer {gw.admin_key}"} if admin else {}
    text = httpx.get(gw.base_url.removesuffix("/v1") + "/metrics", headers=headers, timeout=30).text
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), lint.stdout + lint.stderr
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, next((sample.labels[k] for k in LABELS if k in sample.labels), ""))] = sample.value
    return out


async def flood_loop(client: openai.AsyncOpenAI, model: str, stop: asyncio.Event, results: list) -> None:
    """One client of a flood with short prompts and long answers (what a request waiting in an
    engine's queue holds of its tenant's counter is its prompt: the flood's running output soon
    passes it, and a light tenant waiting then may take it back)."""
    while not stop.is_set():
        r = await client.completions.create(
            model=model, prompt="hi", max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True}
        )
        results.append(r.usage.completion_tokens)


def revocation_run(gw: Gateway, flood_clients: int = 6, light_requests: int = 6) -> dict[str, Any]:
    """Alice floods (more clients than the engine's batch and queue hold); once she fills them, bob
    sends short requests one at a time. Every request must be served in full, and the dispatcher's
    books must count each of alice's once: returns the dispatcher's stats once nothing is in flight."""
    c = clients(gw)
    model = gw.config.model

    async def scenario() -> tuple[list, list]:
        stop = asyncio.Event()
        flood: list = []
        tasks = [asyncio.create_task(flood_loop(c["alice"], model, stop, flood)) for _ in range(flood_clients)]
        await asyncio.sleep(3.0)  # alice's requests fill the batch and the engine's queue
        light = []
        for _ in range(light_requests):
            r = await c["bob"].completions.create(
                model=model, prompt="How is a request taken back?", max_tokens=4, extra_body={"ignore_eos": True}
            )
            light.append(r.usage.completion_tokens)
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*tasks)
        return flood, light

    flood, light = asyncio.run(scenario())
    assert light == [4] * light_requests
    assert flood and all(r == MAX_TOKENS for r in flood), [r for r in flood if r != MAX_TOKENS][:3]
    deadline = time.monotonic() + 10.0
    while (stats := gw.stats())["tenants"]["alice"]["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.1)  # the last finish reports on their way
    alice, bob = stats["tenants"]["alice"], stats["tenants"]["bob"]
    assert alice["revoked"] >= 1, alice  # taken back from the engine, and served later
    assert alice["finished"] == len(flood) and alice["in_flight"] == 0 and alice["queued"] == 0, alice
    assert alice["output_tokens"] == sum(flood)  # each ran once: what the clients got is what was counted
    assert sum(w["prompt_tokens"] for w in stats["workers"]) == alice["prompt_tokens"] + bob["prompt_tokens"]
    return stats
