"""The Redis state store against a real Redis server, and the ``state`` section of the configuration."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from fairgate.common.config import StateSettings
from fairgate.common.sections import ConfigError
from fairgate.core import FairScheduler, SchedulerConfig
from fairgate.dispatcher.state_store import MemoryStore, RedisStore, open_store
from fairgate.gateway.config import parse_config

SEED = [{"name": "alice", "key_hash": "h-a", "weight": 1.0}, {"name": "bob", "key_hash": "h-b", "weight": 2.0}]
NODES = [{"name": "org", "parent": "", "weight": 2.0}, {"name": "org-b", "parent": "", "weight": 1.0}]


def run(coro):
    return asyncio.run(coro)


def test_yaml_tenants_seed_an_empty_redis_once_then_redis_wins(redis_url):
    app = "seed-" + uuid.uuid4().hex[:6]

    async def scenario():
        first = await open_store(StateSettings(redis_url=redis_url), app)
        assert await first.load_tenants(SEED, NODES) == (SEED, NODES)
        await first.put_tenant({"name": "carol", "key_hash": "h-c", "weight": 3.0})
        await first.delete_tenant("alice")
        await first.put_node({"name": "team", "parent": "org", "weight": 5.0})
        await first.delete_node("org-b")
        await first.close()
        again = await open_store(StateSettings(redis_url=redis_url), app)
        changed_yaml = [{"name": "alice", "key_hash": "h-a", "weight": 9.0}]
        tenants, nodes = await again.load_tenants(changed_yaml, [{"name": "other"}])
        await again.close()
        return sorted(tenants, key=lambda t: t["name"]), sorted(nodes, key=lambda n: n["name"])

    tenants, nodes = run(scenario())
    assert tenants == [SEED[1], {"name": "carol", "key_hash": "h-c", "weight": 3.0}]
    assert nodes == [NODES[0], {"name": "team", "parent": "org", "weight": 5.0}]


def test_a_start_that_dies_while_seeding_leaves_redis_unseeded_and_the_next_start_seeds_it(redis_url, monkeypatch):
    """The seeds and the seeded mark are one transaction: a start failing before it commits writes
    nothing, so the next start seeds the tenants (before, the mark could be set with no tenants, and
    every key was refused from then on)."""
    from redis.asyncio.client import Pipeline

    app = "dies-" + uuid.uuid4().hex[:6]
    execute = Pipeline.execute

    async def dies(self, *args, **kwargs):
        raise ConnectionError("the dispatcher's node went away")

    async def scenario():
        first = await open_store(StateSettings(redis_url=redis_url), app)
        monkeypatch.setattr(Pipeline, "execute", dies)
        with pytest.raises(ConnectionError):
            await first.load_tenants(SEED, NODES)
        monkeypatch.setattr(Pipeline, "execute", execute)
        await first.close()
        again = await open_store(StateSettings(redis_url=redis_url), app)
        loaded = await again.load_tenants(SEED, NODES)
        racing = await open_store(StateSettings(redis_url=redis_url), app)
        later = await racing.load_tenants([{"name": "other", "key_hash": "h-o", "weight": 1.0}], [])
        await again.close()
        await racing.close()
        return loaded, later

    loaded, later = run(scenario())
    assert loaded == (SEED, NODES)
    assert sorted(t["name"] for t in later[0]) == sorted(t["name"] for t in SEED)  # seeded once: Redis wins


def test_durable_state_round_trips_through_redis(redis_url):
    s = FairScheduler(SchedulerConfig())
    s.worker_join("w", 1000)
    s.submit("r1", "alice", 10, 5, 0.0)
    s.assign(0.0)
    s.on_report("w", {"r1": 3}, started={"r1": 10})

    async def scenario():
        store = await open_store(StateSettings(redis_url=redis_url, key_prefix="t"), "state-" + uuid.uuid4().hex[:6])
        assert await store.load_state() is None
        await store.save_state(s.durable_state())
        got = await store.load_state()
        await store.close()
        return got

    restored = FairScheduler(SchedulerConfig())
    restored.restore_durable(run(scenario()))
    assert restored.was_lost("r1")  # known as charged until its worker re-announces it
    restored.worker_join("w", 1000)
    assert restored.adopt("w", "r1", "alice", 10, 5, 3)  # re-announced with its 3 tokens: charged them again
    assert restored.tenants["alice"].counter == s.tenants["alice"].counter
    assert restored.tenants["alice"].output_tokens == s.tenants["alice"].output_tokens


def test_saves_go_to_redis_as_a_journal_and_a_restart_reads_the_last_state_written(redis_url):
    """Many saves of a running scheduler: each writes what changed (a fresh base when the changes
    outgrow it); a new store reads back exactly the last state saved. A second dispatcher writing the
    same keys (an upgrade's overlap) never mixes its changes into the other's base."""
    import json

    s = FairScheduler(SchedulerConfig())
    for t in range(30):
        s.add_tenant(f"t{t}", 1.0)
    s.worker_join("w", 100_000, max_running=64)
    app = "journal-" + uuid.uuid4().hex[:6]
    settings = StateSettings(redis_url=redis_url, key_prefix="t")

    async def scenario():
        import redis.asyncio as aioredis

        store, other = await open_store(settings, app), await open_store(settings, app)
        raw = aioredis.from_url(redis_url)
        lengths = []
        for n in range(60):
            s.submit(f"r{n}", f"t{n % 30}", 10, 5, float(n))
            s.assign(float(n))
            s.on_report("w", {f"r{n}": 1}, started={f"r{n}": 10})
            if n % 3 == 0 and n:
                s.on_finish(f"r{n - 3}", 1, "stop", float(n))
            await store.save_state(s.durable_state())
            lengths.append(await raw.llen(f"t:{app}:journal"))
        latest = json.loads(json.dumps(s.durable_state()))
        assert await (await open_store(settings, app)).load_state() == latest
        await other.save_state({**latest, "next_seq": -1})  # the other writes a base of its own
        await store.save_state({**latest, "next_seq": -2})  # this one's change, after the other's base
        assert (await other.load_state())["next_seq"] == -1
        await raw.aclose()
        return lengths

    lengths = run(scenario())
    assert max(lengths) > 3, "the saves were not written as changes"
    assert 0 in lengths[1:], "the journal was never folded into a fresh base"


def test_memory_store_is_the_default_and_keeps_nothing():
    store = run(open_store(StateSettings(), "x"))
    assert isinstance(store, MemoryStore)
    assert run(store.load_tenants(SEED, NODES)) == (SEED, NODES) and run(store.load_state()) is None


def test_unreachable_redis_fails_with_a_clear_error():
    from tests.conftest import free_port

    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", "x")
    with pytest.raises(RuntimeError, match="Redis did not answer"):
        run(store.wait_ready(0.5))


BASE = {"tenants": [{"name": "a", "api_key": "k" * 16}], "admin_api_key": "admin" * 4}


def test_state_section_defaults_to_memory_and_env_url_wins(monkeypatch):
    config, _ = parse_config(BASE)
    assert config.state.redis_url is None and config.state.snapshot_interval_s == 1.0
    config, _ = parse_config({**BASE, "state": {"redis_url": "redis://file:1/0", "snapshot_interval_s": 0.25}})
    assert config.state.redis_url == "redis://file:1/0" and config.state.snapshot_interval_s == 0.25
    monkeypatch.setenv("FAIRGATE_REDIS_URL", "redis://env:2/0")
    config, _ = parse_config({**BASE, "state": {"redis_url": "redis://file:1/0"}})
    assert config.state.redis_url == "redis://env:2/0"


@pytest.mark.parametrize(
    "state",
    [{"redis_url": "http://x"}, {"snapshot_interval_s": 0}, {"snapshot_interval_s": True}, {"colour": 1}, "redis"],
)
def test_bad_state_sections_are_refused(state):
    with pytest.raises(ConfigError, match="state"):
        parse_config({**BASE, "state": state})


ADAPTERS = [{"name": "support", "base_model": "m", "path": "/w/support", "nodes": ["org"]}]


def test_configured_adapters_seed_redis_once_even_when_its_tenants_were_seeded_before(redis_url):
    """A store seeded before adapters existed still takes the configuration's adapters, once; then the
    admin API's changes are what a restarted dispatcher finds."""
    app = "adapters-" + uuid.uuid4().hex[:6]

    async def scenario():
        first = await open_store(StateSettings(redis_url=redis_url), app)
        await first.load_tenants(SEED, NODES)  # an older gateway's start
        assert await first.load_adapters(ADAPTERS) == ADAPTERS
        await first.put_adapter({"name": "sales", "base_model": "m", "path": "/w/sales", "nodes": [""]})
        await first.delete_adapter("support")
        await first.close()
        again = await open_store(StateSettings(redis_url=redis_url), app)
        loaded = await again.load_adapters([{**ADAPTERS[0], "path": "/elsewhere"}])
        await again.close()
        return loaded

    assert run(scenario()) == [{"name": "sales", "base_model": "m", "path": "/w/sales", "nodes": [""]}]
