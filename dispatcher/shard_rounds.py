"""The rounds between dispatcher shards, live: every ``tau`` each shard's change batches are asked for,
combined once (``fairgate.core.shards.FleetFigures``), and the fleet's figures sent back to every shard
with what of it was combined. A shard that does not answer within the round is left out of it: its
batches stay with it and go in a later round, so its charges are late, never lost or counted twice.
Then each tenant's waiting requests are dealt over the shards that answered, by their capacity
(``fairgate.core.shards.deal``): a shard hands the newest over, and their callers ask the other.

A shard is anything with the two calls of ``ShardEndpoint``: a dispatcher in this process
(``LocalShard``), or a dispatcher actor's handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from fairgate.common.waits import within
from fairgate.core.shards import Figures, FleetFigures, deals
from fairgate.dispatcher.service import DispatcherService

log = logging.getLogger(__name__)

Batches = list[tuple[int, dict[str, Figures]]]


class ShardEndpoint(Protocol):
    name: str

    async def batches(self) -> tuple[Batches, dict[str, int], int]:
        """Its change batches not yet combined, its waiting requests per tenant, its capacity (workers)."""
        ...

    async def adopt(self, fleet: Mapping[str, Figures], waiting_elsewhere: Iterable[str], combined: int) -> None: ...

    async def hand_over(self, tenant: str, count: int, to: str) -> int:
        """Deal up to ``count`` of the tenant's waiting requests to shard ``to``; how many went."""
        ...


class LocalShard:
    """A dispatcher shard in this process."""

    def __init__(self, name: str, service: DispatcherService) -> None:
        self.name = name
        self._service = service

    async def batches(self) -> tuple[Batches, dict[str, int], int]:
        return self._service.round_batches()

    async def adopt(self, fleet: Mapping[str, Figures], waiting_elsewhere: Iterable[str], combined: int) -> None:
        self._service.round_adopt(fleet, waiting_elsewhere, combined)

    async def hand_over(self, tenant: str, count: int, to: str) -> int:
        return self._service.hand_over(tenant, count, to)


class FleetRounds:
    """Runs the rounds of ``shards`` every ``tau_s``; a shard's answer is waited for ``timeout_s``."""

    def __init__(self, shards: Sequence[ShardEndpoint], tau_s: float = 0.05, timeout_s: float = 1.0) -> None:
        self.shards = list(shards)
        self.tau_s = tau_s
        self.timeout_s = timeout_s
        self.fleet = FleetFigures()
        self.rounds = 0
        self.left_out = 0  # shards' answers missing from a round, in all
        self.dealt = 0  # waiting requests handed to another shard, in all

    async def round(self) -> None:
        """One round: ask, combine, send back."""
        answers = await asyncio.gather(
            *(within(s.batches(), self.timeout_s) for s in self.shards), return_exceptions=True
        )
        sent, waiting, capacity = {}, {}, {}
        for shard, answer in zip(self.shards, answers, strict=True):
            if isinstance(answer, BaseException):
                self.left_out += 1
                log.warning("shard rounds: %s did not answer (%r); left out of this round", shard.name, answer)
                continue
            sent[shard.name], waiting[shard.name], capacity[shard.name] = answer
        self.fleet.round(sent)
        figures = self.fleet.figures
        replies = []
        for shard in self.shards:
            if shard.name not in sent:
                continue
            elsewhere = {t for name, tenants in waiting.items() if name != shard.name for t in tenants}
            combined = self.fleet.combined.get(shard.name, 0)
            replies.append(within(shard.adopt(figures, elsewhere, combined), self.timeout_s))
        for result in await asyncio.gather(*replies, return_exceptions=True):
            if isinstance(result, BaseException):
                log.warning("shard rounds: a shard did not take the fleet's figures (%r)", result)
        await self._deal(waiting, capacity)
        self.rounds += 1

    async def _deal(self, waiting: Mapping[str, Mapping[str, int]], capacity: Mapping[str, int]) -> None:
        """Each tenant's waiting requests over the shards that answered, by their capacity."""
        answered = [s for s in self.shards if s.name in waiting]
        moves = [
            within(answered[src].hand_over(tenant, n, answered[dst].name), self.timeout_s)
            for tenant, src, dst, n in deals([waiting[s.name] for s in answered], [capacity[s.name] for s in answered])
        ]
        for result in await asyncio.gather(*moves, return_exceptions=True):
            if isinstance(result, BaseException):
                log.warning("shard rounds: a shard did not hand requests over (%r)", result)
            else:
                self.dealt += result

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until ``stop`` is set."""
        while not stop.is_set():
            await self.round()
            with contextlib.suppress(TimeoutError):
                await within(stop.wait(), self.tau_s)
