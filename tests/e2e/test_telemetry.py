"""Observability end to end on real Ray, gRPC and HTTP: the span tree of one request (ingress and worker
processes, one trace), /metrics scraped during a two-tenant overload against the dispatcher's exact
figures, and the live page in headless Chromium (its screenshot kept under out/)."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time

import pytest
from ray import serve

from tests.conftest import REPO
from tests.e2e.gateway_helpers import Gateway, clients, closed_loop, deploy, scrape

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gw(serve_port):
    gateway = deploy(
        "telemetry",
        serve_port,
        workers=2,
        kv_tokens=4000,
        step_s=0.02,
        tenants=("alice", "bob", "carol"),
        max_running=4,
        telemetry={"traces": "memory", "top_tenants": 2},
    )
    yield gateway
    gateway.delete()


def spans_of(gw: Gateway) -> list[dict]:
    """Finished spans from the ingress and from every worker replica (asked through Serve handles)."""
    spans = serve.get_deployment_handle("Ingress", gw.name).finished_spans.remote().result(timeout_s=30)
    workers = serve.get_deployment_handle("WorkerReplica", gw.name)
    seen: dict[str, list[dict]] = {}
    for _ in range(40):
        info = workers.info.remote().result(timeout_s=30)
        if info["worker_id"] not in seen:
            seen[info["worker_id"]] = workers.finished_spans.remote().result(timeout_s=30)
        if len(seen) == 2:
            break
    return spans + [s for rows in seen.values() for s in rows]


def test_one_request_is_one_trace_from_the_ingress_into_the_worker(gw):
    client = clients(gw)["alice"]

    async def one() -> str:
        stream = await client.completions.create(
            model="fairgate-sim", prompt="word " * 12, max_tokens=6, stream=True, extra_body={"ignore_eos": True}
        )
        rid = ""
        async for chunk in stream:
            rid = chunk.id
        return rid

    rid = asyncio.run(one())
    for _ in range(50):  # the worker's span ends a moment after the client saw the last chunk
        spans = spans_of(gw)
        root = [s for s in spans if s["name"] == "fairgate.request" and s["attributes"]["fairgate.request_id"] == rid]
        if root and any(
            s["name"] == "fairgate.worker.generate" and s["trace_id"] == root[0]["trace_id"] for s in spans
        ):
            break
        time.sleep(0.2)
    assert len(root) == 1
    request = root[0]
    tree = {s["span_id"]: s for s in spans if s["trace_id"] == request["trace_id"]}
    by_name = {s["name"]: s for s in tree.values()}
    assert set(by_name) == {"fairgate.request", "fairgate.queue", "fairgate.generate", "fairgate.worker.generate"}
    assert request["parent_id"] is None
    assert by_name["fairgate.queue"]["parent_id"] == request["span_id"]
    assert by_name["fairgate.generate"]["parent_id"] == request["span_id"]
    assert by_name["fairgate.worker.generate"]["parent_id"] == by_name["fairgate.generate"]["span_id"]
    assert "first_token" in by_name["fairgate.generate"]["events"]
    attrs = request["attributes"]
    assert attrs["fairgate.tenant"] == "alice" and attrs["fairgate.prompt_tokens"] == 12
    assert attrs["fairgate.completion_tokens"] == 6 and attrs["fairgate.finish_reason"] == "length"
    queue = by_name["fairgate.queue"]["attributes"]
    assert queue["fairgate.counter"] > 0 and queue["fairgate.worker"].startswith("worker-")
    worker = by_name["fairgate.worker.generate"]["attributes"]
    assert worker["fairgate.request_id"] == rid and worker["fairgate.completion_tokens"] == 6


def test_metrics_during_an_overload_match_the_dispatchers_exact_figures(gw):
    c = clients(gw)
    results: list = []

    async def overload():
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(closed_loop(c[t], "fairgate-sim", stop, results))
            for t in ("alice", "bob")
            for _ in range(6)
        ]
        await asyncio.sleep(3.0)
        before = await asyncio.to_thread(gw.stats)
        during = await asyncio.to_thread(scrape, gw)
        after = await asyncio.to_thread(gw.stats)
        stop.set()
        await asyncio.gather(*tasks)
        return before, during, after

    before, during, after = asyncio.run(overload())
    assert all(r == 40 for r in results)
    for t in ("alice", "bob"):
        got = during[("fairgate_tenant_service_total", t)]
        # the scrape reads one snapshot taken between the two exact readings (or up to 1 s before)
        assert before["tenants"][t]["service"] - 2000 <= got <= after["tenants"][t]["service"]
    assert during[("fairgate_queue_depth", "")] >= 0 and during[("fairgate_fairness_bound_2u", "")] > 0
    assert 0 < during[("fairgate_jain_index", "")] <= 1
    assert during[("fairgate_ttft_seconds_count", "")] > 0
    # once everything has settled, the scrape and the dispatcher agree exactly
    for _ in range(100):
        exact = gw.stats()
        if exact["in_flight"] == 0 and exact["queue_depth"] == 0:
            break
        time.sleep(0.1)
    time.sleep(1.1)  # past the ingress's one-second snapshot cache
    settled = scrape(gw)
    for t in ("alice", "bob"):
        assert settled[("fairgate_tenant_service_total", t)] == pytest.approx(exact["tenants"][t]["service"])
        assert settled[("fairgate_tenant_output_tokens_total", t)] == exact["tenants"][t]["output_tokens"]
    anonymous = scrape(gw, admin=False)  # no tenant's name or usage without the admin key: only the sum
    assert {tenant for (_, tenant) in anonymous if tenant} == {"other"}  # and no worker's id
    assert not {name for (name, _) in anonymous} & {
        "fairgate_queue_depth",
        "fairgate_workers",
        "fairgate_worker_kv_tokens",
    }
    total = sum(exact["tenants"][t]["service"] for t in exact["tenants"])
    assert anonymous[("fairgate_tenant_service_total", "other")] == pytest.approx(total)
    # top_tenants: 2, so carol (least served) is folded into "other"
    assert ("fairgate_tenant_service_total", "carol") not in settled
    assert settled[("fairgate_tenant_service_total", "other")] == pytest.approx(exact["tenants"]["carol"]["service"])
    workers = {w["id"] for w in exact["workers"]}
    assert {k[1] for k in settled if k[0] == "fairgate_worker_kv_tokens"} == workers


def chromium(*args: str, timeout_s: float = 90) -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.fail("chromium is needed (Debian's package; scripts/test.sh installs it)")
    flags = [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--window-size=1280,1200",
    ]
    done = subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=timeout_s)
    return done.stdout


def test_the_live_page_renders_the_tenants_and_updates_in_headless_chromium(gw):
    c = clients(gw)
    url = gw.base_url.removesuffix("/v1") + "/dashboard#key=" + gw.admin_key
    out = REPO / "out"
    out.mkdir(exist_ok=True)
    shot = out / "dashboard.png"
    shot.unlink(missing_ok=True)
    pages: list[str] = []

    async def overload():
        stop, results = asyncio.Event(), []
        tasks = [
            asyncio.create_task(closed_loop(c[t], "fairgate-sim", stop, results))
            for t in ("alice", "bob")
            for _ in range(6)
        ]
        await asyncio.sleep(4.0)
        pages.append(await asyncio.to_thread(chromium, "--virtual-time-budget=6000", "--dump-dom", url))
        await asyncio.to_thread(chromium, "--virtual-time-budget=6000", f"--screenshot={shot}", url)
        stop.set()
        await asyncio.gather(*tasks)

    asyncio.run(overload())
    dom = pages[0]
    assert "alice" in dom and "bob" in dom, dom[-2000:]
    updates = int(re.search(r'id="updates">(\d+)<', dom).group(1))
    assert updates >= 2, "the page refreshed itself"
    assert 'id="error"></span>' in dom, "no error shown"
    gap = re.search(r'id="gap">([^<]+)<', dom).group(1)
    assert gap != "–"
    assert shot.is_file() and shot.stat().st_size > 10_000
