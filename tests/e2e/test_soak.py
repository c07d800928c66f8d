"""A bounded soak: minutes of two-tenant saturation through the whole gateway (real Ray, gRPC, HTTP and
Redis). The dispatcher's and the ingress's memory stay flat, and no per-request state is left.

Marked ``soak`` (``-m "not soak"`` leaves it out). It runs two minutes by default (about 1,200
requests after the warm-up), which is what CI runs; ``FAIRGATE_SOAK_S=600`` gives the full ten on
demand, a smaller value a quick local try.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import psutil
import pytest
import ray

from fairgate.dispatcher.actor import dispatcher_name
from tests.conftest import REPO
from tests.e2e.gateway_helpers import clients, deploy

REPO_OUT = REPO / "out"

pytestmark = [pytest.mark.slow, pytest.mark.soak]

SOAK_S = float(os.environ.get("FAIRGATE_SOAK_S", 120))
WARMUP_S = min(60.0, SOAK_S / 5)


def ingress_rss(app: str) -> int:
    """Resident memory of the app's ingress replica process (Ray names it after the deployment)."""
    for proc in psutil.process_iter(["cmdline"]):
        if f"ServeReplica:{app}:Ingress" in " ".join(proc.info["cmdline"] or []):
            return proc.memory_info().rss
    raise AssertionError("no ingress replica process found")


def test_minutes_at_saturation_keep_memory_flat_and_leave_nothing_behind(serve_port, redis_url):
    gw = deploy(
        "soak",
        serve_port,
        workers=2,
        kv_tokens=4000,
        step_s=0.03,  # about 13 requests/s: saturated (the clients outnumber the batch) at half a core
        tenants=("alice", "bob"),
        max_running=4,
        state={"redis_url": redis_url},
    )
    actor = ray.get_actor(dispatcher_name(gw.name), namespace="fairgate")
    c = clients(gw)

    async def client(tenant: str, stream: bool, stop: asyncio.Event, counts: dict) -> None:
        while not stop.is_set():
            try:
                r = await c[tenant].completions.create(
                    model="fairgate-sim",
                    prompt="word " * 30,
                    max_tokens=20,
                    stream=stream,
                    extra_body={"ignore_eos": True},
                )
                if stream:
                    async for _ in r:
                        pass
                counts["ok"] += 1
            except Exception as exc:
                counts["errors"].append(repr(exc))

    async def scenario():
        stop, counts, samples = asyncio.Event(), {"ok": 0, "errors": []}, []
        tasks = [asyncio.create_task(client(t, i % 2 == 0, stop, counts)) for t in ("alice", "bob") for i in range(12)]
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < SOAK_S:
            await asyncio.sleep(min(10.0, SOAK_S / 20))
            proc = await actor.process.remote()
            stats = await actor.stats.remote()
            samples.append((elapsed, proc["rss_bytes"], ingress_rss(gw.name), counts["ok"], stats["queue_depth"]))
        stop.set()
        await asyncio.gather(*tasks)
        return counts, samples

    try:
        counts, samples = asyncio.run(scenario())
        end = ray.get(actor.stats.remote())
        for _ in range(100):
            busy = end["queue_depth"] + end["in_flight"] + end["pending_submits"] + end["orphans"]
            if not busy:
                break
            time.sleep(0.2)
            end = ray.get(actor.stats.remote())
    finally:
        gw.delete()
    warm = [s for s in samples if s[0] >= WARMUP_S]
    first, last = warm[0], warm[-1]
    mib = 1 << 20
    report = {
        "seconds": SOAK_S,
        "requests": counts["ok"],
        "errors": len(counts["errors"]),
        "dispatcher_rss_mib": [round(s[1] / mib, 1) for s in warm],
        "ingress_rss_mib": [round(s[2] / mib, 1) for s in warm],
        "queue_depth": [s[4] for s in warm],
    }
    REPO_OUT.mkdir(exist_ok=True)
    (REPO_OUT / "soak.json").write_text(json.dumps(report, indent=1))
    print(
        f"soak {SOAK_S:.0f} s: {counts['ok']} requests, {len(counts['errors'])} errors; "
        f"dispatcher RSS {first[1] / mib:.1f} -> {last[1] / mib:.1f} MiB, "
        f"ingress RSS {first[2] / mib:.1f} -> {last[2] / mib:.1f} MiB (after {WARMUP_S:.0f} s warm-up)"
    )
    assert not counts["errors"], counts["errors"][:5]
    assert min(s[4] for s in warm) > 0, "saturated: something was always waiting"
    for name, i in (("dispatcher", 1), ("ingress", 2)):
        growth = last[i] - first[i]
        assert growth <= max(0.10 * first[i], 24 * mib), f"{name} memory grew {growth / mib:.1f} MiB"
    assert end["queue_depth"] == end["in_flight"] == end["pending_submits"] == end["orphans"] == 0
    tenants = end["tenants"]
    assert all(t["queued"] == 0 and t["in_flight"] == 0 for t in tenants.values())
    assert all(w["committed"] == 0 and w["pending_count"] == 0 for w in end["workers"])
