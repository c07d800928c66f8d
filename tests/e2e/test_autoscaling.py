"""Autoscaling on the dispatcher's demand, end to end with simulated workers: a load ramp takes the worker
deployment from 1 to at least 3 replicas and back to 1 once the load stops; no request fails; and the
counter gap between the two backlogged tenants stays within 2U of the pool at every sampled moment, the
pool changing as replicas come and go. The scale events and the gap around each go to out/autoscale.json.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import pytest

from tests.conftest import REPO
from tests.e2e.gateway_helpers import clients, deploy

pytestmark = pytest.mark.slow

KV_PER_WORKER = 2000
PROMPT = "word " * 40
MAX_TOKENS = 30


def two_u(pool_tokens: int) -> float:
    """docs/architecture.md: U = max(w_p x longest prompt, w_q x KV pool), with w_p = 1, w_q = 2."""
    return 2 * max(40, 2 * pool_tokens)


def test_a_load_ramp_scales_workers_up_and_back_down_without_losing_fairness(serve_port):
    gw = deploy(
        "autoscale",
        serve_port,
        workers=1,
        kv_tokens=KV_PER_WORKER,
        step_s=0.02,
        tenants=("alice", "bob"),
        max_running=4,
        autoscaling={"min_replicas": 1, "max_replicas": 4, "upscale_delay_s": 1, "downscale_delay_s": 4},
    )
    c = clients(gw)
    results: list = []

    async def client(tenant: str, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                r = await c[tenant].completions.create(
                    model="fairgate-sim", prompt=PROMPT, max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True}
                )
                results.append(r.usage.completion_tokens)
            except Exception as exc:
                results.append(exc)

    samples: list[dict] = []

    async def sample(stop: asyncio.Event, start: float) -> None:
        while not stop.is_set():
            s = await asyncio.to_thread(gw.stats)
            active = [w for w in s["workers"] if not w["draining"]]
            a, b = s["tenants"]["alice"], s["tenants"]["bob"]
            samples.append(
                {
                    "t": round(time.monotonic() - start, 2),
                    "workers": len(active),
                    "pool": sum(w["kv_tokens"] for w in active),
                    "backlogged": a["queued"] > 0 and b["queued"] > 0,
                    "gap": abs(a["counter"] - b["counter"]),
                    "queued": s["queue_depth"],
                }
            )
            await asyncio.sleep(0.25)

    async def wait_for_workers(predicate, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if samples and predicate(samples[-1]["workers"]):
                return True
            await asyncio.sleep(0.25)
        return False

    async def scenario() -> tuple[bool, bool, int]:
        start = time.monotonic()
        stop_sampling, stop_load = asyncio.Event(), asyncio.Event()
        sampler = asyncio.create_task(sample(stop_sampling, start))
        load = [asyncio.create_task(client(t, stop_load)) for t in ("alice", "bob") for _ in range(14)]
        scaled_up = await wait_for_workers(lambda n: n >= 3, 90)
        await asyncio.sleep(4)  # a while at full size
        peak = max(s["workers"] for s in samples)
        stop_load.set()
        await asyncio.gather(*load)
        scaled_down = await wait_for_workers(lambda n: n == 1, 90)
        stop_sampling.set()
        await sampler
        return scaled_up, scaled_down, peak

    try:
        scaled_up, scaled_down, peak = asyncio.run(scenario())
    finally:
        gw.delete()
    events = []
    for before, after in itertools.pairwise(samples):
        if after["workers"] != before["workers"]:
            events.append(
                {
                    "t": after["t"],
                    "workers": [before["workers"], after["workers"]],
                    "gap": [round(before["gap"]), round(after["gap"])],
                    "2U": two_u(after["pool"]),
                }
            )
    out = REPO / "out"
    out.mkdir(exist_ok=True)
    (out / "autoscale.json").write_text(json.dumps({"events": events, "samples": samples}, indent=1))
    for e in events:
        print(
            f"t={e['t']:6.1f} s  workers {e['workers'][0]} -> {e['workers'][1]}  gap {e['gap'][0]} -> "
            f"{e['gap'][1]} (2U = {e['2U']:.0f})"
        )
    failures = [r for r in results if not isinstance(r, int) or r != MAX_TOKENS]
    assert not failures, failures[:5]
    assert scaled_up, f"never reached 3 workers (peak {peak})"
    assert scaled_down, "did not return to 1 worker after the load stopped"
    backlogged = [s for s in samples if s["backlogged"]]
    assert backlogged
    worst = max(backlogged, key=lambda s: s["gap"] / two_u(s["pool"]))
    print(
        f"largest gap while both backlogged: {worst['gap']:.0f} with {worst['workers']} workers "
        f"(2U = {two_u(worst['pool']):.0f})"
    )
    assert all(s["gap"] <= two_u(s["pool"]) for s in backlogged)
