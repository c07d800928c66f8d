"""Cache-aware fair dispatch through the whole gateway (simulated workers, whose engines keep a prefix
cache as vLLM's do), with the official client: a conversation's next turn goes to the worker holding
its prefix, the engine's exact cached count reaches the charge at w_c, identical prompts of two
tenants never share a cached block unless the tenants share a cache group, and the hit rates show."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

from fairgate.core import LinearCost

from .gateway_helpers import Gateway, deploy

SYSTEM = "you are the cluster's assistant and you answer about tenants queues and engines " * 20  # 300 tokens
TURN_1 = SYSTEM + "first question about the queue"
TURN_2 = TURN_1 + " the first answer and then a second question about the engines and their caches"


@pytest.fixture(scope="module")
def gw(serve_port):
    gateway = deploy(
        "cache",
        serve_port,
        policy="vtc-locality:5000",
        placement="prefix-affinity",
        workers=2,
        tenants=("alice", "bob", "carol", "dave"),
        cache_groups={"carol": "acme", "dave": "acme"},
    )
    yield gateway
    gateway.delete()


def client(gw: Gateway, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=gw.keys[tenant], max_retries=0, timeout=60)


def ask(gw: Gateway, tenant: str, prompt: str, max_tokens: int = 4):
    return client(gw, tenant).completions.create(
        model=gw.config.model, prompt=prompt, max_tokens=max_tokens, extra_body={"ignore_eos": True}
    )


def workers(gw: Gateway) -> dict[str, dict]:
    return {w["id"]: w for w in gw.stats()["workers"]}


def delta(before: dict[str, dict], after: dict[str, dict], key: str) -> dict[str, int]:
    return {wid: after[wid][key] - before[wid][key] for wid in after if after[wid][key] != before[wid][key]}


def test_the_next_turn_goes_to_the_worker_holding_its_prefix_and_pays_w_c_for_its_hits(gw):
    start = workers(gw)
    # bob's long request takes the first worker, so alice's first turn starts on the other one
    long = threading.Thread(target=ask, args=(gw, "bob", "a long job " * 3, 200))
    long.start()
    for _ in range(200):
        if gw.stats()["in_flight"]:
            break
        threading.Event().wait(0.02)
    first = ask(gw, "alice", TURN_1)
    long.join()
    after_first = workers(gw)
    (holder,) = [w for w, d in delta(start, after_first, "prompt_tokens").items() if d == first.usage.prompt_tokens]
    # both workers idle now: most room would pick either; the prefix decides
    alice_before = gw.stats()["tenants"]["alice"]["service"]
    second = ask(gw, "alice", TURN_2)
    after_second = workers(gw)
    assert delta(after_first, after_second, "prompt_tokens") == {holder: second.usage.prompt_tokens}
    cached = delta(after_first, after_second, "cached_tokens").get(holder, 0)
    assert cached >= 256  # the first turn's full blocks (the ingress hashes by 256 tokens; the engine caches by 16)
    charged = gw.stats()["tenants"]["alice"]["service"] - alice_before
    cost = LinearCost()
    expected = cost.total(second.usage.prompt_tokens, second.usage.completion_tokens) - cost.cached_discount(cached)
    assert charged == pytest.approx(expected)
    assert gw.stats()["tenants"]["alice"]["cached_tokens"] >= cached


def hits(gw: Gateway, tenant: str, prompt: str) -> int:
    """Prompt tokens of one request of ``tenant`` that the engine found cached."""
    before = gw.stats()["tenants"][tenant]["cached_tokens"]
    ask(gw, tenant, prompt)
    return gw.stats()["tenants"][tenant]["cached_tokens"] - before


def test_identical_prompts_of_two_tenants_share_no_cache_unless_their_group_does(gw):
    secret = "a secret plan that only alice knows about in every detail " * 4
    assert hits(gw, "alice", secret) == 0
    assert hits(gw, "alice", secret) >= 32  # her own prompt again: cached
    assert hits(gw, "bob", secret) == 0  # the same prompt of another tenant: never
    assert hits(gw, "bob", TURN_2) == 0  # alice's conversation, word for word: never
    assert hits(gw, "bob", SYSTEM + "something else") >= 64  # his own system prompt, sent just before
    assert hits(gw, "carol", TURN_2 + " from acme") == 0
    assert hits(gw, "dave", TURN_2 + " from acme") >= 64  # the same organisation shares on purpose


def test_hit_rates_are_on_metrics(gw):
    headers = {"Authorization": f"Bearer {gw.admin_key}"}
    text = httpx.get(gw.base_url.removesuffix("/v1") + "/metrics", headers=headers, timeout=10).text
    assert "fairgate_worker_prefix_hit_ratio" in text
    assert 'fairgate_tenant_cached_prompt_tokens_total{tenant="alice"}' in text


def test_the_engines_kv_events_feed_the_index_in_the_dispatchers_keys(gw):
    """The simulated engines report what their caches store and evict, keyed as the ingress hashes
    prompts (per tenant group): the index learns it from them, and its expectations match the
    engines' exact counts on a conversation replay, shared groups included."""
    before = gw.stats()["prefix_index"]
    history = {(t, c): SYSTEM + f" conversation {c} of {t}" for t in ("alice", "carol", "dave") for c in range(2)}
    for turn in range(3):
        for key, prompt in history.items():
            history[key] = prompt + f" turn {turn} " + "and a question about the queue " * 30
            ask(gw, key[0], history[key])
    after = gw.stats()["prefix_index"]
    assert after["event_fed"]  # the workers' events arrived
    compared = after["compared"] - before["compared"]
    agreed = after["agreement"] * after["compared"] - (before["agreement"] or 0) * before["compared"]
    assert compared >= 18 and agreed / compared >= 0.95, (agreed, compared)
    assert sum(row["blocks"] for row in after["workers"].values()) > 0
