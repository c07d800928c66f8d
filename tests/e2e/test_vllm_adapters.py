"""LoRA adapters on real vLLM workers (CPU, the project's tiny model): three adapters made here with
``peft`` (random weights), served through fairgate and by vLLM's own server with the same adapters and
engine settings. Greedy answers agree field by field; with room for 2 adapters on the GPU and 2 in host
memory, the third evicts the least recently used and the evicted one comes back on demand; two tenants
on different adapters share the engine fairly."""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from fairgate.workers.engines.vllm.reference_server import vllm_server
from fairgate.workers.engines.vllm.settings import VllmSettings
from tests.conftest import free_port

from .gateway_helpers import Gateway, scrape, start_deploy
from .lora_adapters import make_adapter

pytestmark = pytest.mark.slow

NAMES = ("acme/a1", "acme/a2", "acme/a3")
VLLM = {"model": "tiny", "kv_tokens": 1024, "block_size": 32, "cpu_threads": 1, "max_loras": 2, "max_cpu_loras": 2}


@pytest.fixture(scope="module")
def servers(serve_port, tmp_path_factory):
    """fairgate with one vLLM worker, and vLLM's own server loading the same adapters at start."""
    folder = tmp_path_factory.mktemp("adapters")
    model = VllmSettings(model="tiny").model_path()
    paths = {name: str(make_adapter(model, folder / name.replace("/", "-"), seed)) for seed, name in enumerate(NAMES)}
    alone_settings = VllmSettings.from_dict(
        {**VLLM, "serve_args": ["--lora-modules", *(f"{n}={p}" for n, p in paths.items())]}
    )
    adapters = [
        {"name": "acme/a1", "base_model": "tiny", "path": paths["acme/a1"], "nodes": ["alice"]},
        {"name": "acme/a2", "base_model": "tiny", "path": paths["acme/a2"], "nodes": ["bob"]},
        {"name": "acme/a3", "base_model": "tiny", "path": paths["acme/a3"], "nodes": [""]},
    ]
    log = folder / "server.log"
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(1) as pool:
        alone = pool.submit(stack.enter_context, vllm_server(alone_settings, "tiny", free_port(), log))
        starting = start_deploy("vllm-adapters", serve_port, workers=1, vllm=VLLM, adapters=adapters)
        try:
            yield starting.ready(), alone.result()
        finally:
            starting.gateway.delete()


def fairgate(gw: Gateway, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=gw.keys[tenant], max_retries=0, timeout=120)


def greedy(client: openai.OpenAI, model: str) -> tuple:
    r = client.completions.create(model=model, prompt="the tenant asked the worker", max_tokens=12, temperature=0)
    c = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "write about the cache"}], max_tokens=12, temperature=0
    )
    return (
        r.model,
        r.choices[0].text,
        r.choices[0].finish_reason,
        r.usage.prompt_tokens,
        r.usage.completion_tokens,
        c.model,
        c.choices[0].message.content,
        c.usage.prompt_tokens,
        c.usage.completion_tokens,
    )


def test_answers_agree_with_vllms_own_server_adapter_by_adapter(servers):
    gw, alone_url = servers
    alone = openai.OpenAI(base_url=alone_url, api_key="none", max_retries=0, timeout=120)
    answers = {}
    for model, tenant in (("acme/a1", "alice"), ("acme/a2", "bob"), ("acme/a3", "carol"), ("tiny", "carol")):
        answers[model] = greedy(fairgate(gw, tenant), model)
        assert answers[model] == greedy(alone, model), model
    assert len({a[1] for a in answers.values()}) == 4  # each adapter changes the output: it was applied
    with pytest.raises(openai.NotFoundError):  # bob's adapter is not alice's, here as on any gateway
        fairgate(gw, "alice").completions.create(model="acme/a2", prompt="hi", max_tokens=2)


def _worker(gw: Gateway) -> dict:
    return gw.stats("tiny")["workers"][0]


def test_adapters_load_and_evict_on_demand_under_a_cap_of_two(servers):
    gw, _ = servers
    for model, tenant in (("acme/a1", "alice"), ("acme/a2", "bob"), ("acme/a3", "carol")):
        fairgate(gw, tenant).completions.create(model=model, prompt="hello", max_tokens=4)
    deadline = time.monotonic() + 10
    while set(_worker(gw)["host_adapters"]) != {"acme/a2", "acme/a3"} and time.monotonic() < deadline:
        time.sleep(0.2)
    assert set(_worker(gw)["host_adapters"]) == {"acme/a2", "acme/a3"}  # a1, least recently used, evicted
    before = scrape(gw)
    fairgate(gw, "alice").completions.create(model="acme/a1", prompt="hello", max_tokens=4)  # back on demand
    deadline = time.monotonic() + 10
    while "acme/a1" not in _worker(gw)["host_adapters"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "acme/a1" in _worker(gw)["host_adapters"] and len(_worker(gw)["host_adapters"]) == 2
    text = httpx.get(
        gw.base_url.removesuffix("/v1") + "/metrics", headers={"Authorization": f"Bearer {gw.admin_key}"}, timeout=30
    ).text
    loads = {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("fairgate_adapter_loads_total{")
    }
    assert loads["acme/a1"] >= 2 and loads["acme/a2"] >= 1 and loads["acme/a3"] >= 1, loads
    assert before  # the scrape passes promtool's check with adapter series in it


def test_two_tenants_on_different_adapters_share_the_engine_fairly(servers):
    gw, _ = servers
    stop = asyncio.Event()
    widest = [0]

    async def loop(tenant: str, model: str) -> None:
        c = openai.AsyncOpenAI(base_url=gw.base_url, api_key=gw.keys[tenant], max_retries=0, timeout=120)
        while not stop.is_set():
            await c.completions.create(model=model, prompt="word " * 30, max_tokens=16, extra_body={"ignore_eos": True})

    async def scenario() -> dict[str, float]:
        tasks = [asyncio.create_task(loop("alice", "acme/a1")) for _ in range(12)]
        tasks += [asyncio.create_task(loop("bob", "acme/a2")) for _ in range(24)]
        await asyncio.sleep(4)
        first = await asyncio.to_thread(gw.stats, "tiny")
        for _ in range(20):
            await asyncio.sleep(0.5)
            widest[0] = max(widest[0], len((await asyncio.to_thread(_worker, gw))["gpu_adapters"]))
        last = await asyncio.to_thread(gw.stats, "tiny")
        stop.set()
        await asyncio.gather(*tasks)
        return {t: last["tenants"][t]["service"] - first["tenants"][t]["service"] for t in ("alice", "bob")}

    service = asyncio.run(scenario())
    assert min(service.values()) > 0, service
    assert abs(service["alice"] - service["bob"]) <= 0.25 * sum(service.values()), service  # bob sends twice as much
    assert 1 <= widest[0] <= 2  # never more adapters in the batch than the GPU holds
