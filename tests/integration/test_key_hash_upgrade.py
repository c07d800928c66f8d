"""A Redis written before keys were hashed with a secret (plain SHA-256 digests): the dispatcher
upgrades every stored hash in place at its start, and the same keys keep working."""

from __future__ import annotations

import asyncio
import json
import uuid

import redis
import yaml

from fairgate.common.key_hashing import KEYED_PREFIX, SECRET_ENV, KeyHasher, key_digest
from fairgate.dispatcher.actor import DispatcherActor
from fairgate.gateway.config import deployable, parse_config

CLUSTER = "u" * 32
KEYS = {"alice": "alice-key-from-before-1", "bob": "bob-key-from-before-22"}


def test_plain_digests_in_redis_become_keyed_hashes_and_the_keys_keep_working(redis_url, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    app = "upgrade-" + uuid.uuid4().hex[:6]
    store = redis.Redis.from_url(redis_url, decode_responses=True)
    old = {n: json.dumps({"name": n, "key_hash": key_digest(k), "weight": 1.0}) for n, k in KEYS.items()}
    store.hset(f"fairgate:{app}:tenants", mapping=old)
    store.set(f"fairgate:{app}:seeded", "1")
    with open("gateway/default_config.yaml") as f:
        raw = yaml.safe_load(f)
    raw["state"] = {"redis_url": redis_url}
    config, _ = parse_config(raw)
    hasher = KeyHasher.from_environment(CLUSTER)
    settings = deployable(config, CLUSTER)

    async def scenario():
        d = DispatcherActor.__ray_actor_class__(app, settings, CLUSTER)
        await d._ready()
        try:
            for name, key in KEYS.items():
                assert await d.lookup_key(hasher.of_key(key)) == name
                assert await d.lookup_key(key_digest(key)) is None
        finally:
            await d.shutdown()

    asyncio.run(scenario())
    stored = [json.loads(v)["key_hash"] for v in store.hgetall(f"fairgate:{app}:tenants").values()]
    assert sorted(stored) == sorted(hasher.of_key(k) for k in KEYS.values())
    assert all(h.startswith(KEYED_PREFIX) for h in stored)
