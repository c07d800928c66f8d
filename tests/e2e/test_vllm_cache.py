"""Cache-aware fair dispatch in front of two real vLLM workers (CPU, the tiny model, vLLM's prefix
caching on): multi-turn conversations of two tenants; the next turn goes to the worker holding the
conversation's prefix, vLLM's cached counts reach the charges at w_c, and identical prompts of two
tenants never share a cached block."""

from __future__ import annotations

import threading
import time

import openai
import pytest

from dispatcher.core import LinearCost

from .gateway_helpers import Gateway, deploy
from .test_vllm import VLLM

pytestmark = pytest.mark.slow

SYSTEM = "the tenant queue is served by the engine in its turn " * 30  # about 330 tokens: one hash stride


@pytest.fixture(scope="module")
def gw(serve_port):
    gateway = deploy(
        "vllm-cache", serve_port, policy="vtc-locality:5000", placement="prefix-affinity", workers=2, vllm=VLLM
    )
    yield gateway
    gateway.delete()


def ask(gw: Gateway, tenant: str, prompt: str, max_tokens: int = 4):
    c = openai.OpenAI(base_url=gw.base_url, api_key=gw.keys[tenant], max_retries=0, timeout=120)
    return c.completions.create(
        model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True}
    )


def started_on(gw: Gateway, before: dict[str, dict]) -> set[str]:
    return {w["id"] for w in gw.stats()["workers"] if w["prompt_tokens"] != before[w["id"]]["prompt_tokens"]}


def snapshot_workers(gw: Gateway) -> dict[str, dict]:
    return {w["id"]: w for w in gw.stats()["workers"]}


def test_conversations_follow_their_prefix_and_pay_w_c_for_vllms_cached_tokens(gw):
    cost = LinearCost()
    for tenant in ("alice", "bob"):  # each tenant's conversation, the same words: salted apart
        start = snapshot_workers(gw)
        long = threading.Thread(target=ask, args=(gw, "carol", "a long job for the other worker", 96))
        long.start()  # it takes one worker, so the first turn starts on the other
        deadline = time.monotonic() + 60
        while not started_on(gw, start) and time.monotonic() < deadline:
            time.sleep(0.02)
        before_first = snapshot_workers(gw)
        first = ask(gw, tenant, SYSTEM + "first question")
        (holder,) = started_on(gw, before_first)
        long.join()
        assert first.usage.prompt_tokens_details.cached_tokens == 0  # nobody of this tenant sent it before
        mid = snapshot_workers(gw)
        before = gw.stats()["tenants"][tenant]["service"]
        second = ask(gw, tenant, SYSTEM + "first question and its answer, then a second question")
        assert started_on(gw, mid) == {holder}  # the worker that holds the prefix
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert cached >= 256
        charged = gw.stats()["tenants"][tenant]["service"] - before
        total = cost.total(second.usage.prompt_tokens, second.usage.completion_tokens)
        assert charged == pytest.approx(total - cost.cached_discount(cached))
