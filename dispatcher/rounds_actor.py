"""The dispatcher shards' rounds as one small named Ray actor: it holds the fleet's figures and runs
``FleetRounds`` for each model pool over the shards' actors. It keeps nothing durable: restarted by
Ray, it goes on from the newest figures a shard adopted (``FleetRounds``), and a shard restarted
meanwhile has what it sent after its durable state taken back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable
from typing import Any

import ray

from fairgate.common.config import ShardSettings
from fairgate.core.shards import LastRound, ShardReport
from fairgate.dispatcher.names import dispatcher_name, dispatcher_resources, rounds_name
from fairgate.dispatcher.round_wire import RoundClient, last_from, last_json, report_from
from fairgate.dispatcher.shard_rounds import FleetRounds

log = logging.getLogger(__name__)


class RemoteShard:
    """A dispatcher shard, for one model pool (``ShardEndpoint``), over its rounds' endpoint
    (``round_wire.py``). Its actor is looked up by name once and asked where the endpoint is whenever
    the connection breaks (a restarted shard listens elsewhere)."""

    def __init__(self, shard: int, model: str, client: RoundClient) -> None:
        self.name = str(shard)
        self._model = model
        self._client = client

    async def batches(self) -> ShardReport:
        return report_from(await self._client.call("batches", {"model": self._model}))

    async def adopt(self, last: LastRound, waiting_elsewhere: Iterable[str]) -> None:
        body = {"model": self._model, "last": last_json(last), "elsewhere": sorted(waiting_elsewhere)}
        await self._client.call("adopt", body)

    async def hand_over(self, tenant: str, count: int, to: str) -> int:
        body = {"model": self._model, "tenant": tenant, "count": count, "to": to}
        return int((await self._client.call("hand_over", body))["moved"])

    async def recall(self) -> LastRound:
        return last_from(await self._client.call("recall", {"model": self._model}))


def shard_client(app: str, shard: int, secret: str) -> RoundClient:
    """One connection to a shard's rounds' endpoint, for all its pools."""
    actor: Any = None

    async def address() -> str:
        nonlocal actor
        if actor is None:
            actor = ray.get_actor(dispatcher_name(app, shard), namespace="fairgate")
        return await actor.rounds_address.remote()

    return RoundClient(address, secret.encode())


@ray.remote(num_cpus=0)
class ShardRoundsActor:
    def __init__(self, app: str, models: list[str], settings: ShardSettings, secret: str) -> None:
        clients = [shard_client(app, k, secret) for k in range(settings.count)]
        self._rounds = {
            m: FleetRounds([RemoteShard(k, m, clients[k]) for k in range(settings.count)], settings.tau_s)
            for m in models
        }
        self._stop = asyncio.Event()
        self._running = asyncio.get_event_loop().create_task(self._run())

    async def _run(self) -> None:
        await asyncio.gather(*(self._keep_running(rounds) for rounds in self._rounds.values()))

    async def _keep_running(self, rounds: FleetRounds) -> None:
        """A round that fails (a bug, not a shard's silence: that is left out) is logged and the next one
        runs."""
        while not self._stop.is_set():
            try:
                await rounds.run(self._stop)
            except Exception:
                log.exception("shard rounds: a round failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), rounds.tau_s)

    async def figures(self) -> dict[str, dict[str, Any]]:
        """Per pool: rounds run, shards' answers left out, requests dealt, shards seen restarted, the
        last round's number and the most served in one round (the live page and /metrics show them)."""
        return {
            m: {
                "rounds": r.rounds,
                "round": r.number,
                "left_out": r.left_out,
                "dealt": r.dealt,
                "restarts": r.restarts,
                "tau_s": r.tau_s,
                "round_service": r.round_service,
            }
            for m, r in self._rounds.items()
        }

    async def process(self) -> dict[str, int]:
        """This actor's process (benchmarks count its CPU)."""
        return {"pid": os.getpid()}

    async def shutdown(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            await self._running


def get_or_create_rounds(app: str, models: list[str], settings: ShardSettings, secret: str) -> Any:
    """The app's rounds' runner, created if there is none yet; Ray restarts it whenever its process dies."""
    return ShardRoundsActor.options(
        resources=dispatcher_resources(),
        name=rounds_name(app),
        namespace="fairgate",
        get_if_exists=True,
        lifetime="detached",
        max_concurrency=1000,
        max_restarts=-1,
    ).remote(app, models, settings, secret)
