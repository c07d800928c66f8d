"""Where the dispatcher keeps what must outlive it: tenants and its durable scheduler state.

``MemoryStore`` (the default) keeps nothing beyond the actor's life. ``RedisStore`` keeps tenants (key
hashes and weights, never keys) and the scheduler's durable state, so that a restarted dispatcher
continues with the same tenants and counters. The YAML file's tenants seed an empty Redis once; after
that Redis is the source of truth and tenants change through the admin API.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any, Protocol

from fairgate.common.config import StateSettings
from fairgate.core import journal

log = logging.getLogger(__name__)


class StateStore(Protocol):
    async def load_tenants(
        self, seed: list[dict[str, Any]], seed_nodes: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The tenants and tree nodes to start with (the configuration's, when the store has none yet)."""
        ...

    async def put_tenant(self, record: dict[str, Any]) -> None: ...

    async def delete_tenant(self, name: str) -> None: ...

    async def put_node(self, record: dict[str, Any]) -> None: ...

    async def delete_node(self, name: str) -> None: ...

    async def load_adapters(self, seed: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The LoRA adapters to start with (the configuration's, when the store has none yet)."""
        ...

    async def put_adapter(self, record: dict[str, Any]) -> None: ...

    async def delete_adapter(self, name: str) -> None: ...

    async def load_state(self, pool: str = "") -> dict[str, Any] | None: ...

    async def save_state(self, state: dict[str, Any], pool: str = "") -> None: ...

    async def close(self) -> None: ...


class MemoryStore:
    """No durability: tenants come from the configuration at every start, counters start at zero."""

    async def load_tenants(
        self, seed: list[dict[str, Any]], seed_nodes: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return list(seed), list(seed_nodes)

    async def put_tenant(self, record: dict[str, Any]) -> None:
        return None

    async def delete_tenant(self, name: str) -> None:
        return None

    async def put_node(self, record: dict[str, Any]) -> None:
        return None

    async def delete_node(self, name: str) -> None:
        return None

    async def load_adapters(self, seed: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(seed)

    async def put_adapter(self, record: dict[str, Any]) -> None:
        return None

    async def delete_adapter(self, name: str) -> None:
        return None

    async def load_state(self, pool: str = "") -> dict[str, Any] | None:
        return None

    async def save_state(self, state: dict[str, Any], pool: str = "") -> None:
        return None

    async def close(self) -> None:
        return None


class RedisStore:
    """Keys under ``prefix``: ``:tenants``, ``:nodes`` and ``:adapters`` (hashes name -> JSON record),
    ``:seeded`` and ``:adapters:seeded``; per durable state, ``:state`` (the first model pool's
    scheduler; ``:state:<model>`` each other pool's) holds a base, ``:journal[:<model>]`` the changes
    written after it (a list), ``:writer[:<model>]`` who wrote the base. A state is the base folded with
    its writer's changes (``fairgate.core.journal``): a second dispatcher writing the same keys (an
    upgrade's overlap) never mixes its changes into another's base."""

    def __init__(self, url: str, prefix: str) -> None:
        import redis.asyncio as aioredis

        self._redis = aioredis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self._tenants = f"{prefix}:tenants"
        self._nodes = f"{prefix}:nodes"
        self._seeded = f"{prefix}:seeded"
        self._adapters = f"{prefix}:adapters"
        self._state = f"{prefix}:state"
        self._journal = f"{prefix}:journal"
        self._writer = f"{prefix}:writer"
        self._writer_id = uuid.uuid4().hex
        self._writers: dict[str, journal.JournalWriter] = {}

    async def wait_ready(self, timeout_s: float) -> None:
        """Wait for Redis to answer (it may start after the dispatcher); raise a clear error if it never does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        delay = 0.2
        while True:
            try:
                await self._redis.ping()
                return
            except Exception as exc:  # redis raises several connection error types
                if loop.time() >= deadline:
                    raise RuntimeError(f"fairgate: Redis did not answer within {timeout_s:.0f} s: {exc}") from None
                log.warning("dispatcher: waiting for Redis: %s", exc)
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)

    async def load_tenants(
        self, seed: list[dict[str, Any]], seed_nodes: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Seeds and the seeded mark go in one transaction: a start that dies half way leaves Redis
        unseeded (the next start seeds it), never marked seeded with no tenants (every key a 401)."""
        if await self._seed_once(seed, seed_nodes):
            return list(seed), list(seed_nodes)
        rows = await self._redis.hgetall(self._tenants)
        nodes = await self._redis.hgetall(self._nodes)
        return [json.loads(v) for v in rows.values()], [json.loads(v) for v in nodes.values()]

    async def _seed_once(self, seed: list[dict[str, Any]], seed_nodes: list[dict[str, Any]]) -> bool:
        """Whether this call seeded Redis (False: it was seeded before, or by another start meanwhile)."""
        from redis.exceptions import WatchError

        async with self._redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(self._seeded)
                if await pipe.exists(self._seeded):
                    return False
                pipe.multi()
                if seed:
                    pipe.hset(self._tenants, mapping={t["name"]: json.dumps(t) for t in seed})
                if seed_nodes:
                    pipe.hset(self._nodes, mapping={n["name"]: json.dumps(n) for n in seed_nodes})
                pipe.set(self._seeded, "1")
                await pipe.execute()
                return True
            except WatchError:  # another start seeded it between the check and the transaction
                return False

    async def put_tenant(self, record: dict[str, Any]) -> None:
        await self._redis.hset(self._tenants, record["name"], json.dumps(record))

    async def delete_tenant(self, name: str) -> None:
        await self._redis.hdel(self._tenants, name)

    async def put_node(self, record: dict[str, Any]) -> None:
        await self._redis.hset(self._nodes, record["name"], json.dumps(record))

    async def delete_node(self, name: str) -> None:
        await self._redis.hdel(self._nodes, name)

    async def load_adapters(self, seed: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Seeded once on their own (a store seeded before adapters existed still takes the
        configuration's); after that the admin API changes them."""
        from redis.exceptions import WatchError

        seeded = f"{self._adapters}:seeded"
        async with self._redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(seeded)
                if not await pipe.exists(seeded):
                    pipe.multi()
                    if seed:
                        pipe.hset(self._adapters, mapping={a["name"]: json.dumps(a) for a in seed})
                    pipe.set(seeded, "1")
                    await pipe.execute()
                    return list(seed)
            except WatchError:  # another start seeded them meanwhile: read theirs
                pass
        rows = await self._redis.hgetall(self._adapters)
        return [json.loads(v) for v in rows.values()]

    async def put_adapter(self, record: dict[str, Any]) -> None:
        await self._redis.hset(self._adapters, record["name"], json.dumps(record))

    async def delete_adapter(self, name: str) -> None:
        await self._redis.hdel(self._adapters, name)

    async def load_state(self, pool: str = "") -> dict[str, Any] | None:
        """The saved scheduler state of one model pool ("": the first model's): its base and the
        changes its writer wrote after it."""
        suffix = f":{pool}" if pool else ""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(self._state + suffix)
            pipe.get(self._writer + suffix)
            pipe.lrange(self._journal + suffix, 0, -1)
            raw, writer, entries = await pipe.execute()
        if raw is None:
            return None
        owner = writer.decode() if writer else ""
        changed = []
        for entry in entries:
            author, _, change = entry.decode().partition("\n")
            if author == owner:
                changed.append(json.loads(change))
        return journal.fold(json.loads(raw), *changed)

    async def save_state(self, state: dict[str, Any], pool: str = "") -> None:
        """Write what changed since the last write (or a fresh base: ``JournalWriter``)."""
        suffix = f":{pool}" if pool else ""
        writer = self._writers.setdefault(pool, journal.JournalWriter())
        write = writer.next(state)
        if write is None:
            return
        is_base, encoded = write
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                if is_base:
                    pipe.set(self._state + suffix, encoded)
                    pipe.set(self._writer + suffix, self._writer_id)
                    pipe.delete(self._journal + suffix)
                else:
                    pipe.rpush(self._journal + suffix, f"{self._writer_id}\n{encoded}")
                await pipe.execute()
        except BaseException:
            writer.failed()
            raise
        writer.wrote()

    async def close(self) -> None:
        await self._redis.aclose()


async def open_store(settings: StateSettings, app: str) -> StateStore:
    """The store the ``state`` section of the configuration asks for."""
    if not settings.redis_url:
        return MemoryStore()
    store = RedisStore(settings.redis_url, f"{settings.key_prefix}:{app}")
    await store.wait_ready(settings.connect_timeout_s)
    return store
