"""Fuzzing the HTTP API with hypothesis: whatever a client sends, the answer is never a 5xx, nothing
stays stuck, and the dispatcher's tables are empty once the fuzzing ends."""

from __future__ import annotations

import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .gateway_helpers import Gateway, deploy

pytestmark = pytest.mark.slow

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "tool", "robot"]),
        "content": st.one_of(st.text(max_size=40), VALUES),
    }
)
FIELDS = {
    "model": st.one_of(st.just("fairgate-sim"), VALUES),
    "prompt": st.one_of(st.text(max_size=60), st.lists(st.text(max_size=10), max_size=3), VALUES),
    "messages": st.one_of(st.lists(MESSAGE, max_size=3), VALUES),
    "max_tokens": st.one_of(st.integers(min_value=-5, max_value=5000), VALUES),
    "temperature": st.one_of(st.floats(min_value=-1, max_value=3), VALUES),
    "top_p": st.one_of(st.floats(min_value=-1, max_value=2), VALUES),
    "n": st.one_of(st.integers(min_value=-1, max_value=3), VALUES),
    "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=6), VALUES),
    "stream": st.one_of(st.booleans(), VALUES),
    "seed": st.one_of(st.integers(min_value=-(2**70), max_value=2**70), VALUES),
    "stream_options": st.one_of(st.just({"include_usage": True}), VALUES),
    "ignore_eos": st.one_of(st.booleans(), VALUES),
}
BODIES = st.one_of(
    st.fixed_dictionaries({}, optional=FIELDS),
    VALUES,
)


@pytest.fixture(scope="module")
def gw(serve_port) -> Gateway:
    gateway = deploy("fuzz", serve_port, workers=1, step_s=0.001, max_body_bytes=4096, max_model_len=256)
    yield gateway
    gateway.delete()


def test_no_body_gets_a_5xx_and_nothing_is_left_behind(gw):
    client = httpx.Client(timeout=60, headers={"Authorization": f"Bearer {gw.keys['alice']}"})
    root = gw.base_url

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(path=st.sampled_from(["/completions", "/chat/completions"]), body=BODIES)
    def one(path, body):
        r = client.post(root + path, json=body)
        assert r.status_code < 500, (path, body, r.status_code, r.text[:300])
        if r.status_code >= 400:
            assert "error" in r.json() and r.json()["error"]["message"]

    one()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = gw.stats()
        if stats["in_flight"] == 0 and stats["queue_depth"] == 0 and stats["pending_submits"] == 0:
            break
        time.sleep(0.1)
    assert (stats["in_flight"], stats["queue_depth"], stats["pending_submits"]) == (0, 0, 0)
    assert all(w["committed"] == 0 for w in stats["workers"])
