"""``fairgate bench quota``: token and money quotas held exactly by a whole gateway across 4 ingress
replicas and a dispatcher killed with SIGKILL in the middle of a window (docs/gateway.md: quotas).

``fairgate serve`` as users start it (simulated workers, Redis for state, 4 ingress replicas sharing
one port) and a Redis of its own. Quotas per minute: a node ``org-a`` over two keys (tokens), one of
those keys (money, at the configured prices), a key ``b1`` (tokens) and a key ``d`` that demotes.

- **Kill**: from the start of a minute window, ``a1``, ``a2`` and ``b1`` flood (closed loops, new
  connections spread by the kernel over the replicas). When a quota has used or holds 60% of its
  maximum (or half the window has gone), the dispatcher's process is killed with SIGKILL; Ray starts
  it again from Redis. The floods go on until shortly before the window ends. Per quota: what its
  clients were served in the window (their usage, the money at the configured prices) against its
  maximum: the overshoot, which must stay within one request's largest use, and the dispatcher's own
  count against the clients'.
- **Demote**: in the next window, an in-quota key ``i`` sends requests one after another, first alone,
  then while ``d`` (over its demoting quota from its first requests) floods every engine's batch.
  ``i``'s added latency is set against one request's service alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from fairgate.core.registry import Param
from fairgate.loadgen.benches.base import Bench, Figures, Options, register
from fairgate.loadgen.serve_process import free_port, served_gateway

MODEL = "fairgate-sim"
PROMPT = "word " * 40  # 40 prompt tokens for the simulated tokenizer
MAX_TOKENS = 40  # every answer this long (ignore_eos): a request's largest use is 80 tokens
PRICES = {"input": 100.0, "cached_input": 25.0, "output": 300.0}  # per million tokens
KILL_AT_SHARE = 0.6  # of a quota's maximum, used or held, when the dispatcher is killed
STOP_BEFORE_END_S = 8.0  # the floods stop this long before their window ends: all of it counts there
WINDOW_S = 60.0


@dataclass(frozen=True)
class BenchQuotaConfig:
    clients: int = 4  # closed loops per flooding key
    ingress_replicas: int = 4
    workers: int = 2
    max_running: int = 4  # per worker: the demoting key's flood fills every batch
    step_s: float = 0.01
    org_tokens: int = 24_000  # org-a (a1 and a2 together), per minute
    a1_cost: float = 0.8  # a1, money per minute (50 requests at the prices)
    b1_tokens: int = 12_000
    d_tokens: int = 800  # the demoting key's, per minute: over it from its tenth request


def gateway_config(c: BenchQuotaConfig, keys: Mapping[str, str], admin_key: str, redis_url: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "workers": {
            "count": c.workers,
            "max_running": c.max_running,
            "kv_tokens": 4000,
            "block_size": 1,
            "step_model": {
                "step_overhead_s": c.step_s,
                "prefill_per_token_s": 0.0,
                "decode_per_seq_s": 0.0,
                "decode_per_ctx_token_s": 0.0,
            },
        },
        "ingress": {"replicas": c.ingress_replicas, "default_max_tokens": MAX_TOKENS},
        "state": {"redis_url": redis_url, "snapshot_interval_s": 1.0},
        "limits": {"max_queued_per_tenant": 10_000},
        "tree": [{"name": "org-a"}, {"name": "org-b"}],
        "tenants": [{"name": name, "api_key": key} | _parent(name) for name, key in keys.items()],
        "prices": {MODEL: PRICES},
        "quotas": [
            {"node": "org-a", "window": "minute", "max_tokens": c.org_tokens},
            {"node": "a1", "window": "minute", "max_cost": c.a1_cost},
            {"node": "b1", "window": "minute", "max_tokens": c.b1_tokens},
            {"node": "d", "window": "minute", "max_tokens": c.d_tokens, "over": "demote"},
        ],
        "admin_api_key": admin_key,
    }


def _parent(tenant: str) -> dict[str, str]:
    parent = {"a1": "org-a", "a2": "org-a", "b1": "org-b"}.get(tenant)
    return {"parent": parent} if parent else {}


@dataclass
class Served:
    """What each key's clients were served (usage of 200 answers) and how they were answered."""

    tokens: dict[str, int] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    answers: dict[str, dict[int, int]] = field(default_factory=dict)  # key -> status -> count
    latencies: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, status: int, body: dict[str, Any] | None, latency: float) -> None:
        counts = self.answers.setdefault(key, {})
        counts[status] = counts.get(status, 0) + 1
        if status != 200 or body is None:
            return
        usage = body["usage"]
        prompt, output = usage["prompt_tokens"], usage["completion_tokens"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        self.tokens[key] = self.tokens.get(key, 0) + prompt + output
        price = (prompt - cached) * PRICES["input"] + cached * PRICES["cached_input"] + output * PRICES["output"]
        self.cost[key] = self.cost.get(key, 0.0) + price / 1e6
        self.latencies.setdefault(key, []).append(latency)


async def _ask(base: str, key: str) -> tuple[int, dict[str, Any] | None, float]:
    """One completion on a connection of its own (so the kernel spreads them over the replicas)."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120) as client:
        try:
            r = await client.post("/completions", json=body)
        except httpx.HTTPError:
            return 0, None, time.monotonic() - started
    elapsed = time.monotonic() - started
    return r.status_code, (r.json() if r.status_code == 200 else None), elapsed


async def _flood(base: str, name: str, key: str, until: float, served: Served) -> None:
    while time.time() < until:
        status, body, latency = await _ask(base, key)
        served.add(name, status, body, latency)
        if status != 200:
            await asyncio.sleep(0.05)  # refused: the quota's answer is immediate


def _admin(base: str, admin_key: str, path: str) -> Any:
    r = httpx.get(base.removesuffix("/v1") + path, headers={"Authorization": f"Bearer {admin_key}"}, timeout=10)
    r.raise_for_status()
    return r.json()


def _dispatcher_pid() -> int:
    """The dispatcher actor's process (Ray titles it after the actor's class)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline and cmdline[0].startswith("ray::DispatcherActor"):
            return proc.pid
    raise RuntimeError("no dispatcher process found")


async def _until_window_start(lead_s: float = 0.5) -> float:
    """Sleep until ``lead_s`` after the next minute window begins; returns that window's start."""
    start = math.floor(time.time() / WINDOW_S + 1) * WINDOW_S
    await asyncio.sleep(max(0.0, start + lead_s - time.time()))
    return start


async def kill_phase(base: str, keys: Mapping[str, str], admin_key: str, c: BenchQuotaConfig) -> dict[str, Any]:
    start = await _until_window_start()
    until = start + WINDOW_S - STOP_BEFORE_END_S
    served = Served()
    floods = [
        asyncio.create_task(_flood(base, name, keys[name], until, served))
        for name in ("a1", "a2", "b1")
        for _ in range(c.clients)
    ]
    before = await asyncio.to_thread(_admin, base, admin_key, "/admin/stats")
    killed_at = None
    while killed_at is None:
        await asyncio.sleep(0.25)
        rows = (await asyncio.to_thread(_admin, base, admin_key, "/admin/usage"))["data"]
        fullest = max(_share_taken(row) for row in rows)
        if fullest >= KILL_AT_SHARE or time.time() > start + WINDOW_S / 2:
            os.kill(_dispatcher_pid(), signal.SIGKILL)
            killed_at, taken_at_kill = time.time(), fullest
    restarted_at = None
    while restarted_at is None:
        with contextlib.suppress(httpx.HTTPError):
            stats = await asyncio.to_thread(_admin, base, admin_key, "/admin/stats")
            if stats.get("dispatcher_id") != before.get("dispatcher_id"):
                restarted_at = time.time()
        await asyncio.sleep(0.1)
    await asyncio.gather(*floods)
    await asyncio.sleep(2.0)  # the last answers' settlements reach the book
    book = {row["node"]: row for row in (await asyncio.to_thread(_admin, base, admin_key, "/admin/usage"))["data"]}
    by_node = {
        "org-a": (served.tokens.get("a1", 0) + served.tokens.get("a2", 0), c.org_tokens, "tokens"),
        "a1": (served.cost.get("a1", 0.0), c.a1_cost, "cost"),
        "b1": (served.tokens.get("b1", 0), c.b1_tokens, "tokens"),
    }
    largest_cost = (len(PROMPT.split()) * PRICES["input"] + MAX_TOKENS * PRICES["output"]) / 1e6
    rows = []
    for node, (got, limit, unit) in by_node.items():
        counted = book[node]["used_cost" if unit == "cost" else "used_tokens"]
        rows.append(
            {
                "node": node,
                "unit": unit,
                "max": limit,
                "served": got,
                "dispatcher_counted": counted,
                "overshoot": max(0.0, got - limit),
                "one_request": largest_cost if unit == "cost" else len(PROMPT.split()) + MAX_TOKENS,
            }
        )
    return {
        "window_start": start,
        "killed_after_s": killed_at - start,
        "quota_taken_at_kill": taken_at_kill,
        "dispatcher_back_after_s": restarted_at - killed_at,
        "answers": served.answers,
        "quotas": rows,
        "max_overshoot_tokens": max(r["overshoot"] for r in rows if r["unit"] == "tokens"),
        "max_overshoot_cost": max(r["overshoot"] for r in rows if r["unit"] == "cost"),
        "within_one_request": all(r["overshoot"] <= r["one_request"] + 1e-9 for r in rows),
    }


def _share_taken(row: Mapping[str, Any]) -> float:
    if row.get("max_tokens"):
        return (row["used_tokens"] + row["held_tokens"]) / row["max_tokens"]
    if row.get("max_cost"):
        return (row["used_cost"] + row["held_cost"]) / row["max_cost"]
    return 0.0


async def demote_phase(base: str, keys: Mapping[str, str], c: BenchQuotaConfig, samples: int = 20) -> dict[str, Any]:
    """``i``'s latencies alone, then beside ``d`` flooding over its demoting quota."""
    await _until_window_start(1.0)
    alone = Served()
    for _ in range(samples):
        alone.add("i", *(await _ask(base, keys["i"])))
    d_alone = Served()
    for _ in range(3):
        d_alone.add("d", *(await _ask(base, keys["d"])))
    served = Served()
    until = time.time() + 3600
    floods = [
        asyncio.create_task(_flood(base, "d", keys["d"], until, served)) for _ in range(2 * c.workers * c.max_running)
    ]
    await asyncio.sleep(3.0)  # d uses up its quota and is demoted
    beside = Served()
    for _ in range(samples):
        beside.add("i", *(await _ask(base, keys["i"])))
    for task in floods:
        task.cancel()
    await asyncio.gather(*floods, return_exceptions=True)
    base_latency = statistics.median(alone.latencies["i"])
    one_request = statistics.median(d_alone.latencies["d"])
    added = [x - base_latency for x in beside.latencies.get("i", [])]
    return {
        "i_alone_median_s": base_latency,
        "i_beside_demoted_median_s": statistics.median(beside.latencies["i"]),
        "i_beside_demoted_max_s": max(beside.latencies["i"]),
        "largest_added_s": max(added),
        "one_request_service_s": one_request,
        "within_one_request": max(added) <= one_request,
        "d_answers": served.answers.get("d", {}),
        "d_served_while_i_asked": served.tokens.get("d", 0),
        "i_answers": beside.answers.get("i", {}),
    }


class RedisProcess:
    """A redis-server on a free loopback port, in a folder of its own, for the gateway's state."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("fairgate bench quota needs redis-server (Debian: apt-get install redis-server)")
        self.port = free_port()
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--dir", str(folder)]
        self.proc = subprocess.Popen([*args, "--appendonly", "yes"], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not _answers_ping(self.port):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _answers_ping(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(16).startswith(b"+PONG")
    return False


def bench_quota(c: BenchQuotaConfig | None = None, log: Path | None = None) -> dict[str, Any]:
    c = c or BenchQuotaConfig()
    keys = {name: "fg-bench-" + secrets.token_hex(12) for name in ("a1", "a2", "b1", "d", "i")}
    admin_key = "fg-admin-bench-" + secrets.token_hex(12)
    with tempfile.TemporaryDirectory(prefix="fg-bench-redis-") as folder:
        redis = RedisProcess(Path(folder))
        try:
            gateway = gateway_config(c, keys, admin_key, redis.url)
            secret = {"FAIRGATE_CLUSTER_SECRET": secrets.token_hex(24)}  # Redis keeps key hashes: a stable secret
            with served_gateway(gateway, free_port(), keys["i"], "direct", log, secret) as (base, _, _):
                killed = asyncio.run(kill_phase(base, keys, admin_key, c))
                demoted = asyncio.run(demote_phase(base, keys, c))
        finally:
            redis.stop()
    return {
        "config": c.__dict__,
        "kill": killed,
        "demote": demoted,
        "max_overshoot_tokens": killed["max_overshoot_tokens"],
    }


def format_quota(r: Mapping[str, Any]) -> str:
    k, d = r["kill"], r["demote"]
    lines = [
        f"dispatcher killed (SIGKILL) {k['killed_after_s']:.1f} s into the window, its fullest quota "
        f"{100 * k['quota_taken_at_kill']:.0f}% taken; back {k['dispatcher_back_after_s']:.1f} s later",
        f"{'quota':<8} {'unit':<7} {'max':>9} {'served':>10} {'counted':>10} {'overshoot':>10} {'1 request':>10}",
    ]
    for row in k["quotas"]:
        fmt = "{:>10.4f}" if row["unit"] == "cost" else "{:>10.0f}"
        lines.append(
            f"{row['node']:<8} {row['unit']:<7} {row['max']:>9g} "
            + " ".join(fmt.format(row[x]) for x in ("served", "dispatcher_counted", "overshoot", "one_request"))
        )
    lines += [
        f"answers: {k['answers']}",
        f"max_overshoot_tokens {k['max_overshoot_tokens']:.0f}, max overshoot in money {k['max_overshoot_cost']:.4f}; "
        f"every quota within one request's largest use: {k['within_one_request']}",
        "",
        f"demote: in-quota key alone {d['i_alone_median_s']:.3f} s (median); beside a demoted flood "
        f"{d['i_beside_demoted_median_s']:.3f} s (median), {d['i_beside_demoted_max_s']:.3f} s (max); largest added "
        f"{d['largest_added_s']:.3f} s against one request's service {d['one_request_service_s']:.3f} s: "
        f"within: {d['within_one_request']}",
        f"  the demoted key's answers meanwhile: {d['d_answers']}",
    ]
    return "\n".join(lines)


@register
class QuotaBench(Bench):
    """Token and money quotas across 4 ingress replicas, the dispatcher SIGKILLed mid-window; demote."""

    name = "quota"
    help = "quotas across 4 ingress replicas and a dispatcher SIGKILL; demote"
    params = (
        Param("clients", int, 4, "closed loops per flooding key"),
        Param("log", str, "", "write the gateway's output to this file"),
    )

    def check(self, options: Options) -> None:
        if options["clients"] < 1:
            raise ValueError("--clients must be at least 1")

    def run(self, options: Options) -> Figures:
        return bench_quota(
            BenchQuotaConfig(clients=options["clients"]), Path(options["log"]) if options["log"] else None
        )

    def report(self, figures: Figures) -> str:
        return format_quota(figures)
