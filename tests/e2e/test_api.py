"""The OpenAI API end to end: real Ray, real HTTP (the direct front door, and Serve's), real gRPC and
frames, the official ``openai`` client."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from fairgate.workers.engines.simulated.tokenizer import count_tokens

from .gateway_helpers import Gateway, deploy

IGNORE_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def gw(serve_port) -> Gateway:
    gateway = deploy("api", serve_port, max_body_bytes=4096, max_model_len=512)
    yield gateway
    gateway.delete()


@pytest.fixture(scope="module")
def client(gw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=gw.keys["alice"], max_retries=0, timeout=60)


def wait_idle(gw: Gateway, timeout_s: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = gw.stats()
        if (stats["in_flight"] == 0 and stats["queue_depth"] == 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def test_completion_with_exact_usage(client):
    prompt = "Count these words: one two three, four!"
    r = client.completions.create(model="fairgate-sim", prompt=prompt, max_tokens=9, extra_body=IGNORE_EOS)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == count_tokens(prompt)
    assert r.usage.completion_tokens == 9 == count_tokens(r.choices[0].text)
    assert r.usage.total_tokens == r.usage.prompt_tokens + 9


def test_streaming_completion_with_usage_chunk(client):
    stream = client.completions.create(
        model="fairgate-sim",
        prompt="stream me",
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=IGNORE_EOS,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert count_tokens(text) == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == 2


def test_chat_completion_and_streaming_chat(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    r = client.chat.completions.create(model="fairgate-sim", messages=messages, max_tokens=7, extra_body=IGNORE_EOS)
    assert r.choices[0].message.role == "assistant" and count_tokens(r.choices[0].message.content) == 7
    assert r.usage.completion_tokens == 7 and r.usage.prompt_tokens > 4
    stream = client.chat.completions.create(
        model="fairgate-sim", messages=messages, max_tokens=5, stream=True, extra_body=IGNORE_EOS
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert count_tokens("".join(c.choices[0].delta.content or "" for c in chunks)) == 5
    assert chunks[-1].choices[0].finish_reason == "length"


def test_natural_stop_and_stop_sequences(client):
    r = client.completions.create(model="fairgate-sim", prompt="tell me", max_tokens=400, seed=3)
    assert r.choices[0].finish_reason in ("stop", "length") and 1 <= r.usage.completion_tokens <= 400
    full = client.completions.create(model="fairgate-sim", prompt="abc", max_tokens=30, seed=5, extra_body=IGNORE_EOS)
    words = full.choices[0].text.split()
    stop = " " + words[5]
    first = full.choices[0].text.index(stop)
    cut = client.completions.create(
        model="fairgate-sim", prompt="abc", max_tokens=30, seed=5, stop=[stop], extra_body=IGNORE_EOS
    )
    assert cut.choices[0].text == full.choices[0].text[:first]
    assert cut.choices[0].finish_reason == "stop"


def test_models_and_health(gw, client):
    assert [m.id for m in client.models.list()] == ["fairgate-sim"]
    assert httpx.get(gw.base_url.removesuffix("/v1") + "/healthz").json() == {"status": "ok"}


def test_no_route_map_is_published(gw):
    """FastAPI's generated docs would list every admin route to anyone: there are none."""
    base = gw.base_url.removesuffix("/v1")
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(base + path).status_code == 404, path


def test_a_tier_this_gateway_does_not_serve_is_refused_as_openai_refuses_it(gw, client):
    """No request classes here: auto and default are served, any other tier is a 400 on service_tier."""
    served = client.completions.create(
        model="fairgate-sim", prompt="x", max_tokens=1, extra_body={"service_tier": "auto"}
    )
    assert served.usage.completion_tokens == 1
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="fairgate-sim", prompt="x", max_tokens=1, extra_body={"service_tier": "flex"})
    assert err.value.body["param"] == "service_tier" and "flex" in err.value.body["message"]


def test_unknown_key_and_unknown_model(gw):
    bad = openai.OpenAI(base_url=gw.base_url, api_key="fg-not-a-real-key-123456", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="fairgate-sim", prompt="x", max_tokens=1)
    good = openai.OpenAI(base_url=gw.base_url, api_key=gw.keys["bob"], max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        good.completions.create(model="gpt-4o", prompt="x", max_tokens=1)
    assert err.value.body["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/completions", {"model": "fairgate-sim"}, "prompt"),
        ("/chat/completions", {"model": "fairgate-sim", "messages": []}, "messages"),
        ("/chat/completions", {"model": "fairgate-sim", "messages": [{"role": "wizard", "content": "x"}]}, None),
        ("/completions", {"model": "fairgate-sim", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("/completions", {"model": "fairgate-sim", "prompt": "x", "n": 2}, "n"),
        ("/completions", {"model": "fairgate-sim", "prompt": "x", "temperature": 9}, "temperature"),
        ("/completions", {"model": "fairgate-sim", "prompt": "x", "max_tokens": 600}, "max_tokens"),
    ],
)
def test_bad_requests_get_openai_shaped_400(gw, path, body, param):
    r = httpx.post(gw.base_url + path, json=body, headers={"Authorization": f"Bearer {gw.keys['alice']}"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"].startswith(param)


def test_malformed_json_missing_key_and_oversized_body(gw):
    headers = {"Authorization": f"Bearer {gw.keys['alice']}", "content-type": "application/json"}
    r = httpx.post(gw.base_url + "/completions", content=b"{not json", headers=headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(gw.base_url + "/completions", json={"model": "fairgate-sim", "prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    big = {"model": "fairgate-sim", "prompt": "word " * 5000}
    r = httpx.post(gw.base_url + "/completions", json=big, headers=headers)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_identity_comes_only_from_the_key(gw):
    r = httpx.post(
        gw.base_url + "/completions",
        json={"model": "fairgate-sim", "prompt": "hi", "max_tokens": 3, "user": "alice", "tenant": "alice"},
        headers={"Authorization": f"Bearer {gw.keys['carol']}", "X-Tenant": "alice"},
    )
    assert r.status_code == 200
    before = wait_idle(gw)["tenants"]
    assert before["carol"]["finished"] >= 1


@pytest.mark.parametrize("door", ["base_url", "proxied_url"], ids=["direct", "serve-proxy"])
def test_client_disconnect_mid_stream_aborts_at_the_worker(gw, door):
    headers = {"Authorization": f"Bearer {gw.keys['alice']}"}
    body = {"model": "fairgate-sim", "prompt": "long", "max_tokens": 450, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", getattr(gw, door) + "/completions", json=body, headers=headers, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break  # got the first chunk; now hang up
    # 450 tokens at 10 ms per step would take 4.5 s: freed well before means it was aborted.
    start = time.monotonic()
    stats = wait_idle(gw, timeout_s=3.0)
    assert stats["in_flight"] == 0 and time.monotonic() - start < 3.0
    assert all(w["committed"] == 0 for w in stats["workers"])


def test_serves_the_same_behind_serves_own_front_door(gw):
    """The application answers the same through Serve's proxy (the Kubernetes deployment's front door)."""
    proxied = openai.OpenAI(base_url=gw.proxied_url, api_key=gw.keys["alice"], max_retries=0, timeout=60)
    r = proxied.completions.create(model="fairgate-sim", prompt="one two", max_tokens=4, extra_body=IGNORE_EOS)
    assert r.usage.completion_tokens == 4 and r.usage.prompt_tokens == 2
    chunks = list(
        proxied.chat.completions.create(
            model="fairgate-sim",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            stream=True,
            extra_body=IGNORE_EOS,
        )
    )
    assert count_tokens("".join(c.choices[0].delta.content or "" for c in chunks)) == 3
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.proxied_url, api_key="fg-nobody-" + "x" * 16, max_retries=0).models.list()
