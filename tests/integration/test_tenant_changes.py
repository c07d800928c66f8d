"""The dispatcher's tenant changes, in process (the actor's class without Ray): a change whose save
fails is undone, and only it: a key rotation made meanwhile stays."""

from __future__ import annotations

import asyncio

import yaml

from fairgate.common.key_hashing import key_digest
from fairgate.dispatcher.actor import DispatcherActor
from fairgate.gateway.config import deployable, parse_config


def _dispatcher():
    with open("gateway/default_config.yaml") as f:
        config, _ = parse_config(yaml.safe_load(f))
    return DispatcherActor.__ray_actor_class__("changes", deployable(config, "s" * 32), "s" * 32)


def test_a_failed_change_never_undoes_a_key_rotation_made_while_it_was_saving():
    async def scenario():
        d = _dispatcher()
        await d._ready()
        store = d._store
        saving = asyncio.Event()
        fail = asyncio.Event()
        put = store.put_tenant

        async def put_tenant(record):
            if record["name"] == "carol":  # its save hangs, then fails
                saving.set()
                await fail.wait()
                raise ConnectionError("the store went away")
            await put(record)

        store.put_tenant = put_tenant
        failing = asyncio.create_task(d.change_tenant("create", "carol", key_digest("carol-key-0123456789")))
        await saving.wait()
        rotation = asyncio.create_task(d.change_tenant("update", "alice", key_digest("alice-new-key-0123456789")))
        await asyncio.sleep(0.05)
        fail.set()
        assert (await failing)["error"][0] == 503
        assert (await rotation)["name"] == "alice"
        assert await d.lookup_key(key_digest("alice-new-key-0123456789")) == "alice"
        assert await d.lookup_key(key_digest("carol-key-0123456789")) is None
        await d.shutdown()

    asyncio.run(scenario())
