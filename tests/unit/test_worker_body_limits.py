"""What a worker lets through of a client's body: the admitted limits, the gateway's ids and salts,
no engine-internal fields (``fairgate.workers.body_limits``)."""

from __future__ import annotations

import pytest

from fairgate.workers.body_limits import (
    ENGINE_INTERNAL_FIELDS,
    BodyRefused,
    admitted_body,
    choices_of,
    tenant_cache_salt,
)


def test_max_tokens_is_capped_at_the_admitted_budget_and_set_when_absent():
    assert admitted_body({"max_tokens": 500}, 16, 1, "completions")["max_tokens"] == 16
    assert admitted_body({"max_tokens": 5}, 16, 1, "completions")["max_tokens"] == 5
    assert admitted_body({}, 16, 1, "completions")["max_tokens"] == 16
    chat = admitted_body({"max_tokens": 900, "max_completion_tokens": 800}, 16, 1, "chat")
    assert chat["max_tokens"] == chat["max_completion_tokens"] == 16
    assert admitted_body({}, 16, 1, "chat")["max_completion_tokens"] == 16


def test_choices_share_the_budget_and_never_exceed_what_was_admitted():
    body = admitted_body({"n": 2, "max_tokens": 100}, 20, 2, "completions")
    assert body["max_tokens"] == 10  # 2 choices x 10 <= 20 admitted
    assert admitted_body({"n": 1, "max_tokens": 100}, 20, 2, "completions")["max_tokens"] == 20
    with pytest.raises(BodyRefused, match="4 choices"):
        admitted_body({"n": 4}, 40, 2, "completions")
    with pytest.raises(BodyRefused, match="3 choices"):
        admitted_body({"n": 1, "best_of": 3}, 40, 2, "completions")
    assert choices_of({"n": True}) == 1 and choices_of({"n": 3, "best_of": 5}) == 5


def test_engine_internal_fields_never_reach_the_engine():
    body = {field: "x" for field in ENGINE_INTERNAL_FIELDS} | {"prompt": "hi", "temperature": 0.5}
    out = admitted_body(body, 8, 1, "completions")
    assert not ENGINE_INTERNAL_FIELDS & set(out)
    assert out["prompt"] == "hi" and out["temperature"] == 0.5
    with pytest.raises(BodyRefused, match="beam search"):
        admitted_body({"use_beam_search": True}, 8, 1, "completions")
    with pytest.raises(BodyRefused):
        admitted_body(["not", "an", "object"], 8, 1, "completions")


def test_cache_salts_are_per_tenant_and_need_the_secret():
    a = tenant_cache_salt(b"s" * 32, "alice")
    assert a == tenant_cache_salt(b"s" * 32, "alice")
    assert a != tenant_cache_salt(b"s" * 32, "bob")
    assert a != tenant_cache_salt(b"t" * 32, "alice")
    assert len(a) <= 128 and "/" not in a and "@" not in a
