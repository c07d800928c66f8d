"""``fairgate bench peers``: fairgate and the peers (``fairgate.loadgen.peers.routers``) on the same engines and
the same traffic.

The peers share ``engines`` simulated engines, each behind its own OpenAI server; fairgate runs its own
workers with the same engine settings. Per workload every arm is up at once (two instances of each
where the workload spreads its tenants over two). Each round measures every arm in turn with every
other arm paused (``fairgate.loadgen.pausing``; the machine drifts, docs/speed.md), in the opposite order in odd
rounds: first the light load (one stream at a time; also to one engine alone, for the added first-token
time), then the workload replayed (``fairgate.loadgen.replay``, each pass with prompt text of its own so that no
cache outlives a pass), then, for the peers, until the shared engines are idle. Figures per arm are the
medians of its rounds. The bound is fairgate's for this pool (``bound``): 2U of the KV its engines may
hold in flight, plus its engines' queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fairgate.core import LinearCost, engine_queue_slack, two_u
from fairgate.core.fairness import in_flight_reach
from fairgate.loadgen.benches.openai import PROMPT, OpenAIBenchConfig, bench_client, chat_body, closed_loops, stream_one
from fairgate.loadgen.pausing import paused
from fairgate.loadgen.peers.backends import Backends, shared_backends
from fairgate.loadgen.peers.prompts import prompt_builder
from fairgate.loadgen.peers.routers import PEERS, peer_instance
from fairgate.loadgen.peers.workloads import NAMES, PeerWorkload, peer_workload
from fairgate.loadgen.replay import ReplayConfig, replay
from fairgate.loadgen.serve_process import GatewayLaunch, free_port, served_gateways
from fairgate.workers.engines import engine_for

FAIRGATE = "fairgate"  # where prompts share prefixes, its cache-aware policy; the verdict's arm (every
# fairgate arm's name starts with it, no peer's does)
FAIRGATE_VTC = "fairgate-vtc"  # where prompts share prefixes, also plain VTC placed by room
FAIRGATE_FCFS = "fairgate-fcfs"  # on request (``controls``): fairgate serving in arrival order, placed by room
ALONE = "engine alone"
SETTLE_S = 2.0  # after an arm is continued, its timers catch up before it is measured
OVERCOMMIT = 2.0  # fairgate's defaults, which the bench runs with
MAX_ENGINE_WAITING = 8
LOCALITY_SLACK = 100_000  # fairgate's cache-aware policy's slack where the workload has prefixes


@dataclass
class PeersBenchConfig:
    engine: str = "simulated"
    engines: int = 2
    seconds: float = 40.0  # of each workload, per pass
    rounds: int = 2
    workloads: tuple[str, ...] = NAMES
    peers: tuple[str, ...] = tuple(PEERS)
    # the engine's settings (the config's workers section): the simulated A10G profile with a 10,000-token
    # pool by default, the pool the paper's workloads were made for
    settings: dict[str, Any] = field(default_factory=lambda: {"kv_tokens": 10_000, "step_model": "a10g-llama7b"})
    model: str = "fairgate-sim"
    light_requests: int = 20
    light_max_tokens: int = 16
    seed: int = 42
    # also fairgate serving in arrival order: what the gateway itself costs, apart from what the fair
    # order costs (the order changes which requests run, and so the work)
    controls: bool = False


@dataclass
class Arm:
    urls: list[str]  # its instances' base URLs
    keys: dict[str, str]  # tenant -> API key
    roots: tuple[int, ...]  # the processes that are this arm (paused while others are measured)
    uses_backends: bool


def bound(config: PeersBenchConfig, pw: PeerWorkload) -> float:
    """fairgate's stated bound for this pool and workload (``scheduler_views``: 2U of M, plus queues)."""
    cost = LinearCost()
    prompt, output = pw.workload.longest()
    plugin = engine_for(config.engine)
    pool = config.engines * plugin.capacity(plugin.settings(config.settings))[0]
    queues = engine_queue_slack(cost, prompt, config.engines * MAX_ENGINE_WAITING)
    return two_u(cost, prompt, output, in_flight_reach(pool, OVERCOMMIT)) + queues


def fairgate_arms(pw: PeerWorkload, controls: bool = False) -> dict[str, tuple[str, str]]:
    """fairgate's arms on ``pw``, each with its policy and placement: where prompts share prefixes, the
    cache-aware policy placed by cached prefix and plain VTC placed by room both (what the cache-aware
    one gains or costs shows), else plain VTC; with ``controls``, also FCFS placed by room."""
    vtc = ("vtc", "most-room")
    cache_aware = (f"vtc-locality:{LOCALITY_SLACK}", "prefix-affinity")
    arms = {FAIRGATE: cache_aware, FAIRGATE_VTC: vtc} if pw.block_tokens > 0 else {FAIRGATE: vtc}
    if controls:
        arms[FAIRGATE_FCFS] = ("fcfs", "most-room")
    return arms


def fairgate_config(
    config: PeersBenchConfig, pw: PeerWorkload, keys: dict[str, str], policy: str, placement: str
) -> dict[str, Any]:
    """fairgate with ``config``'s engines as its workers, ``policy`` ordering and ``placement`` placing."""
    return {
        "model": config.model,
        "policy": policy,
        "placement": placement,
        "overcommit": OVERCOMMIT,
        "max_engine_waiting": MAX_ENGINE_WAITING,
        "workers": {"count": config.engines, "engine": config.engine, **config.settings},
        "ingress": {"replicas": pw.gateway_instances, "max_model_len": 1 << 20},
        "limits": {"max_queued_per_tenant": 100_000, "max_queued": 1_000_000},
        "tenants": [{"name": t, "api_key": k, "weight": pw.workload.weight(t)} for t, k in keys.items()],
    }


def bench_peers(config: PeersBenchConfig, log_dir: Path | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"config": asdict(config), "workloads": {}}
    with (
        tempfile.TemporaryDirectory(prefix="fg-peers-") as tmp,
        shared_backends(config.engine, config.engines, config.settings, config.model, log_dir) as backends,
    ):
        for name in config.workloads:
            pw = peer_workload(name, config.engines, config.seconds, config.seed)
            with _arms(config, pw, backends, Path(tmp), log_dir) as arms:
                out["workloads"][name] = _rounds(config, pw, arms, backends)
    return out


@contextlib.contextmanager
def _arms(
    config: PeersBenchConfig, pw: PeerWorkload, backends: Backends, scratch: Path, log_dir: Path | None
) -> Iterator[dict[str, Arm]]:
    tenants = pw.workload.tenants
    with contextlib.ExitStack() as stack:
        keys = {t: "fg-bench-" + secrets.token_hex(12) for t in tenants}
        ours = fairgate_arms(pw, config.controls)
        launches = [
            GatewayLaunch(
                fairgate_config(config, pw, keys, policy, placement),
                free_port(),
                keys[tenants[0]],
                log=log_dir / f"{name}-{pw.name}.log" if log_dir is not None else None,
            )
            for name, (policy, placement) in ours.items()
        ]
        served = stack.enter_context(served_gateways(launches))
        arms = {
            name: Arm([base] * pw.gateway_instances, keys, (pid,), False)
            for name, (base, _, pid) in zip(ours, served, strict=True)
        }
        for name in config.peers:
            urls, roots, key = [], [], "sk-" + secrets.token_hex(16)
            for i in range(pw.gateway_instances):
                log = log_dir / f"{name}-{pw.name}-{i}.log" if log_dir is not None else None
                url, pid = stack.enter_context(
                    peer_instance(PEERS[name], backends.roots, free_port(), scratch, config.model, key, log)
                )
                urls.append(url)
                roots.append(pid)
            arms[name] = Arm(urls, dict.fromkeys(tenants, key), (*roots, *backends.pids), True)
        yield arms


def _rounds(config: PeersBenchConfig, pw: PeerWorkload, arms: dict[str, Arm], backends: Backends) -> dict[str, Any]:
    limit = bound(config, pw)
    passes: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    alone: list[float | None] = []
    everyone = {pid for arm in arms.values() for pid in arm.roots}
    alone_url = backends.roots[0] + "/v1"
    for r in range(config.rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for i, name in enumerate(order):
            arm = arms[name]
            with _paused(everyone - set(arm.roots)):
                time.sleep(SETTLE_S)
                light = asyncio.run(_light_ttft_ms(arm.urls[0], next(iter(arm.keys.values())), config))
                nonce = r * 1_000 + i
                got = asyncio.run(replay(pw.workload, _replay_config(config, pw, arm, limit, nonce, name)))[0].report
                if arm.uses_backends:
                    backends.wait_idle()
            passes[name].append(_figures(got, limit, light))
        with _paused(everyone - set(backends.pids)):
            time.sleep(SETTLE_S)
            alone.append(asyncio.run(_light_ttft_ms(alone_url, "none", config)))
    return _summary(pw, limit, passes, alone)


@contextlib.contextmanager
def _paused(roots: set[int]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for pid in sorted(roots):
            stack.enter_context(paused(pid))
        yield


def _replay_config(
    config: PeersBenchConfig, pw: PeerWorkload, arm: Arm, limit: float, nonce: int, label: str
) -> ReplayConfig:
    routes = {t: tuple(arm.urls[i] for i in spread) for t, spread in pw.instances.items()}
    return ReplayConfig(
        url=arm.urls[0],
        keys=arm.keys,
        model=config.model,
        policy_label=label,
        progress=False,
        prompt=prompt_builder(nonce, pw.block_tokens),
        routes=routes,
        bound=limit,
    )


async def _light_ttft_ms(url: str, key: str, config: PeersBenchConfig) -> float | None:
    """Median first-token time of one stream at a time (a short chat, as ``bench openai``'s light load)."""
    body = chat_body(OpenAIBenchConfig(model=config.model, max_tokens=config.light_max_tokens), PROMPT)
    async with bench_client(key, 1) as client:
        await closed_loops(1, 3, lambda: stream_one(client, url + "/chat/completions", body))  # its connection
        done, _, _ = await closed_loops(
            1, config.light_requests, lambda: stream_one(client, url + "/chat/completions", body)
        )
    return 1000 * statistics.median(t for t, _ in done) if done else None


def _figures(report: dict[str, Any], limit: float, light_ms: float | None) -> dict[str, Any]:
    return {
        "throughput_tokens_per_s": report["throughput_tokens_per_s"],
        "output_tokens_per_s": report["output_tokens_per_s"],
        "requests_finished": report["requests_finished"],
        "gap": report["max_abs_service_diff"],
        "gap_vs_bound": report["max_abs_service_diff"] / limit,
        "jain": report["jain_index"],
        "prefix_hit_rate": report["prefix_hit_rate"],
        "errors": sum(report.get("errors", {}).values()),
        "light_ttft_ms": light_ms,
        "tenants": {
            t: {"p50_ttft_s": v["p50_ttft_s"], "p99_ttft_s": v["p99_ttft_s"], "service": v["service"]}
            for t, v in report["tenants"].items()
        },
    }


def _summary(
    pw: PeerWorkload, limit: float, passes: dict[str, list[dict[str, Any]]], alone: list[float | None]
) -> dict[str, Any]:
    arms: dict[str, Any] = {}
    for name, runs in passes.items():
        med = {k: _median([r[k] for r in runs]) for k in runs[0] if k not in ("tenants", "errors")}
        med["errors"] = sum(r["errors"] for r in runs)
        med["bound_held_every_round"] = all(r["gap"] <= limit for r in runs)
        med["light_ttft_added_ms"] = _median(
            [r["light_ttft_ms"] - a for r, a in zip(runs, alone, strict=True) if None not in (r["light_ttft_ms"], a)]
        )
        med["tenants"] = {
            t: {k: _median([r["tenants"][t][k] for r in runs]) for k in runs[0]["tenants"][t]}
            for t in runs[0]["tenants"]
        }
        arms[name] = med
    return {
        "requests": len(pw.workload.requests),
        "seconds": pw.workload.duration_s,
        "bound": limit,
        "alone_light_ttft_ms": _median(alone),
        "arms": arms,
        "rounds": passes,
        "verdict": verdict(arms),
    }


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def verdict(arms: dict[str, Any]) -> dict[str, Any]:
    """What the issue asks of fairgate on a workload, against the best peer on each figure."""
    peers = {n: a for n, a in arms.items() if not n.startswith(FAIRGATE)}
    ours = arms[FAIRGATE]
    best = max((a["throughput_tokens_per_s"] for a in peers.values()), default=None)
    best_output = max((a["output_tokens_per_s"] for a in peers.values()), default=None)
    fastest = min(
        (a["light_ttft_added_ms"] for a in peers.values() if a["light_ttft_added_ms"] is not None), default=None
    )
    added = ours["light_ttft_added_ms"]
    return {
        "inside_bound": ours["bound_held_every_round"],
        "throughput_vs_best_peer": ours["throughput_tokens_per_s"] / best if best else None,
        "output_vs_best_peer": ours["output_tokens_per_s"] / best_output if best_output else None,
        "light_ttft_added_vs_fastest_peer_ms": added - fastest if None not in (added, fastest) else None,
        "fairer_peers": [n for n, a in peers.items() if a["gap_vs_bound"] < ours["gap_vs_bound"]],
        "faster_peers": [n for n, a in peers.items() if a["throughput_tokens_per_s"] > ours["throughput_tokens_per_s"]],
    }
