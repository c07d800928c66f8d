"""The dispatcher shards' rounds as one small named Ray actor: it holds the fleet's figures and runs
``FleetRounds`` for each model pool over the shards' actors. It keeps nothing durable: restarted by
Ray, it goes on from the newest figures a shard adopted (``FleetRounds``), and a shard restarted
meanwhile has what it sent after its durable state taken back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

import ray

from fairgate.common.config import ShardSettings
from fairgate.core.shards import LastRound, ShardReport
from fairgate.dispatcher.names import dispatcher_name, rounds_name
from fairgate.dispatcher.shard_rounds import FleetRounds

log = logging.getLogger(__name__)


class RemoteShard:
    """A dispatcher shard's actor, for one model pool (``ShardEndpoint``). Its handle is looked up by
    name once, then kept: Ray sends the calls to the actor's next life after a restart."""

    def __init__(self, app: str, shard: int, model: str) -> None:
        self.name = str(shard)
        self._app = app
        self._shard = shard
        self._model = model
        self._actor: Any = None

    def _handle(self) -> Any:
        if self._actor is None:
            self._actor = ray.get_actor(dispatcher_name(self._app, self._shard), namespace="fairgate")
        return self._actor

    async def batches(self) -> ShardReport:
        return await self._handle().round_batches.remote(self._model)

    async def adopt(self, last: LastRound, waiting_elsewhere: Iterable[str]) -> None:
        await self._handle().round_adopt.remote(self._model, last, sorted(waiting_elsewhere))

    async def hand_over(self, tenant: str, count: int, to: str) -> int:
        return await self._handle().hand_over.remote(self._model, tenant, count, to)

    async def recall(self) -> LastRound:
        return await self._handle().last_round.remote(self._model)


@ray.remote(num_cpus=0)
class ShardRoundsActor:
    def __init__(self, app: str, models: list[str], settings: ShardSettings) -> None:
        self._rounds = {
            m: FleetRounds([RemoteShard(app, k, m) for k in range(settings.count)], settings.tau_s) for m in models
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

    async def shutdown(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            await self._running


def get_or_create_rounds(app: str, models: list[str], settings: ShardSettings) -> Any:
    """The app's rounds' runner, created if there is none yet; Ray restarts it whenever its process dies."""
    return ShardRoundsActor.options(
        name=rounds_name(app),
        namespace="fairgate",
        get_if_exists=True,
        lifetime="detached",
        max_concurrency=1000,
        max_restarts=-1,
    ).remote(app, models, settings)
