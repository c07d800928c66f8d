"""The gateway in front of real vLLM workers (CPU, the project's tiny model), with the official client:
the OpenAI API, sampling parameters, and fairness between two tenants flooding one vLLM engine."""

from __future__ import annotations

import asyncio
import statistics

import openai
import pytest

from workers.engines.vllm.prompts import HuggingFacePrompts
from workers.engines.vllm.settings import VllmSettings

from .gateway_helpers import MAX_TOKENS, Gateway, deploy, overload

pytestmark = pytest.mark.slow

KV_TOKENS = 1024
VLLM = {"model": "tiny", "kv_tokens": KV_TOKENS, "block_size": 32}
LOAD = {"alice": 10, "bob": 20}  # closed-loop clients; the pool holds about 8 requests at a time


@pytest.fixture(scope="module")
def vtc_gateway(serve_port):
    gw = deploy("vllm-vtc", serve_port, policy="vtc", workers=1, vllm=VLLM)
    yield gw
    gw.delete()


@pytest.fixture(scope="module")
def prompts() -> HuggingFacePrompts:
    return HuggingFacePrompts(VllmSettings(model="tiny").model_path())


def client(gw: Gateway, tenant: str = "alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=gw.keys[tenant], max_retries=0, timeout=120)


def test_chat_completion_counts_with_the_models_tokenizer_and_template(vtc_gateway, prompts):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me about the queue"}]
    r = client(vtc_gateway).chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, extra_body={"ignore_eos": True}
    )
    assert r.object == "chat.completion" and r.model == "tiny"
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == prompts.count(prompts.chat_prompt(messages), templated=True)
    assert r.usage.completion_tokens == 12


def test_streaming_completion_with_usage(vtc_gateway, prompts):
    stream = client(vtc_gateway).completions.create(
        model="tiny",
        prompt="write a story about the cluster",
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].usage.prompt_tokens == prompts.count("write a story about the cluster", templated=False)
    assert text  # decoded by vLLM's detokenizer


def test_seeded_sampling_repeats_and_stop_strings_cut(vtc_gateway):
    c = client(vtc_gateway)
    kw = {"model": "tiny", "prompt": "the tenant", "max_tokens": 24, "temperature": 0.8, "top_p": 0.9, "seed": 7}
    first = c.completions.create(**kw).choices[0].text
    assert c.completions.create(**kw).choices[0].text == first
    stop = first[5:8]
    if stop.strip():
        cut = c.completions.create(**kw, stop=[stop]).choices[0]
        assert stop not in cut.text and cut.finish_reason == "stop"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": KV_TOKENS}, "max_tokens"),  # prompt + max_tokens beyond the engine's context
    ],
)
def test_refused_parameters_get_a_clear_400(vtc_gateway, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        client(vtc_gateway).completions.create(model="tiny", prompt="hello", **{"max_tokens": 4, **extra})
    assert err.value.status_code == 400
    assert err.value.body["param"] == param


def test_gateway_sees_the_vllm_pool_and_frees_it(vtc_gateway):
    stats = vtc_gateway.stats()
    (worker,) = stats["workers"]
    assert worker["kv_tokens"] == KV_TOKENS
    assert worker["free_tokens"] == KV_TOKENS and stats["in_flight"] == 0


@pytest.fixture(scope="module")
def runs(vtc_gateway, serve_port):
    out = {"vtc": asyncio.run(overload(vtc_gateway, seconds=10.0, load=LOAD, warmup_s=4.0))}
    gw = deploy("vllm-fcfs", serve_port, policy="fcfs", workers=1, vllm=VLLM)
    try:
        out["fcfs"] = asyncio.run(overload(gw, seconds=10.0, load=LOAD, warmup_s=4.0))
    finally:
        gw.delete()
    return out


def test_vtc_keeps_two_tenants_flooding_vllm_within_2u(runs):
    got, _, results = runs["vtc"]
    two_u = 2 * (2 * KV_TOKENS)  # U = max(w_p, w_q) × the pool, with the default linear cost (1, 2)
    assert got["alice"] > 0 and abs(got["alice"] - got["bob"]) <= two_u, got
    assert [r for r in results if r != MAX_TOKENS] == []


def test_fcfs_in_front_of_vllm_does_not_equalise(runs):
    got, _, results = runs["fcfs"]
    assert got["bob"] > 1.4 * got["alice"], got
    assert [r for r in results if r != MAX_TOKENS] == []


def test_light_tenant_is_served_sooner_under_vtc(runs):
    assert statistics.mean(runs["vtc"][1]) < statistics.mean(runs["fcfs"][1])


def test_a_hostile_burst_against_vllm_gets_4xx_and_holds_nothing(vtc_gateway):
    """The abuse suite's burst (tests/e2e/abuse.py) against vLLM workers: every malformed body a clear
    4xx with no internals, abandoned requests leave the dispatcher holding nothing for the tenant, and
    another tenant's request is served right after. Last in the module: carol's counter is charged for
    the prompts vLLM began to prefill."""
    from .abuse import INTERNALS, abandon, send_malformed
    from .test_abuse import holds_nothing

    gw = vtc_gateway

    async def burst():
        answers = await send_malformed(gw.base_url, gw.keys["carol"], "tiny")
        await abandon(gw.base_url, gw.keys["carol"], "tiny", streams=6, calls=4)
        return answers

    answers = asyncio.run(burst())
    for what, status, text in answers:
        assert 400 <= status < 500, (what, status, text[:300])
        assert '"error"' in text and not INTERNALS.search(text), (what, text[:300])
    after = holds_nothing(gw, "carol")
    assert (after["tenants"]["carol"]["in_flight"], after["tenants"]["carol"]["queued"]) == (0, 0)
    r = client(gw, "alice").completions.create(
        model="tiny", prompt="hello", max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert r.usage.completion_tokens == 4
