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
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from fairgate.common.waits import within
from fairgate.core.shards import FleetFigures, LastRound, ShardReport, deals
from fairgate.dispatcher.service import DispatcherService

log = logging.getLogger(__name__)

ROUND_SERVICE_WINDOW_S = 60.0  # how far back the bound's staleness term looks


class ShardEndpoint(Protocol):
    name: str

    async def batches(self) -> ShardReport: ...

    async def adopt(self, last: LastRound, waiting_elsewhere: Iterable[str]) -> None: ...

    async def hand_over(self, tenant: str, count: int, to: str) -> int:
        """Deal up to ``count`` of the tenant's waiting requests to shard ``to``; how many went."""
        ...

    async def recall(self) -> LastRound:
        """The fleet's figures it last adopted."""
        ...


class LocalShard:
    """A dispatcher shard in this process."""

    def __init__(self, name: str, service: DispatcherService) -> None:
        self.name = name
        self._service = service

    async def batches(self) -> ShardReport:
        return self._service.round_batches()

    async def adopt(self, last: LastRound, waiting_elsewhere: Iterable[str]) -> None:
        self._service.round_adopt(last, self.name, waiting_elsewhere)

    async def hand_over(self, tenant: str, count: int, to: str) -> int:
        return self._service.hand_over(tenant, count, to)

    async def recall(self) -> LastRound:
        return self._service.last_round()


class FleetRounds:
    """Runs the rounds of ``shards`` every ``tau_s``; a shard's answer is waited for ``timeout_s``.

    The runner keeps the fleet's figures; a restarted runner goes on from the newest figures any shard
    adopted. A shard that restarted (a new ``life``) has what it sent after its durable state taken
    back from the figures (``FleetFigures.restart``): its workers report that work to it again."""

    def __init__(self, shards: Sequence[ShardEndpoint], tau_s: float = 0.05, timeout_s: float = 1.0) -> None:
        self.shards = list(shards)
        self.tau_s = tau_s
        self.timeout_s = timeout_s
        self.fleet = FleetFigures()
        self.number = 0  # the last round's
        self.rounds = 0  # rounds run by this runner
        self.left_out = 0  # shards' answers missing from a round, in all
        self.dealt = 0  # waiting requests handed to another shard, in all
        self.restarts = 0  # shards seen restarted
        self._served: deque[float] = deque(maxlen=max(1, round(ROUND_SERVICE_WINDOW_S / tau_s)))
        self._total = 0.0  # the fleet's service after the last round
        self._lives: dict[str, str] = {}
        self._recalled = False

    async def round(self) -> None:
        """One round: ask, combine, send back, deal."""
        if not self._recalled:
            self._recalled = await self._recall()
        answers = await asyncio.gather(
            *(within(s.batches(), self.timeout_s) for s in self.shards), return_exceptions=True
        )
        sent, waiting, capacity = {}, {}, {}
        for shard, answer in zip(self.shards, answers, strict=True):
            if isinstance(answer, BaseException):
                self.left_out += 1
                log.warning("shard rounds: %s did not answer (%r); left out of this round", shard.name, answer)
                continue
            self._note_life(shard.name, answer)
            sent[shard.name] = answer.batches
            waiting[shard.name], capacity[shard.name] = answer.waiting, answer.capacity
        self.fleet.round(sent)
        self._note_service()
        self.number += 1
        last = LastRound(self.number, dict(self.fleet.figures), dict(self.fleet.combined))
        replies = []
        for shard in self.shards:
            if shard.name not in sent:
                continue
            elsewhere = {t for name, tenants in waiting.items() if name != shard.name for t in tenants}
            replies.append(within(shard.adopt(last, elsewhere), self.timeout_s))
        for result in await asyncio.gather(*replies, return_exceptions=True):
            if isinstance(result, BaseException):
                log.warning("shard rounds: a shard did not take the fleet's figures (%r)", result)
        await self._deal(waiting, capacity)
        self.rounds += 1

    def _note_service(self) -> None:
        total = sum(f[0] for key, f in self.fleet.figures.items() if key.startswith("t/"))
        if self.rounds:  # the first round of a runner finds what was served before it
            self._served.append(max(0.0, total - self._total))
        self._total = total

    @property
    def round_service(self) -> float:
        """The most the fleet served in one round over the last ``ROUND_SERVICE_WINDOW_S``: the
        staleness term of the fleet's bound (``fairgate.core.shards.sharded_bound``)."""
        return max(self._served, default=0.0)

    def _note_life(self, name: str, report: ShardReport) -> None:
        before = self._lives.get(name)
        self._lives[name] = report.life
        if before is not None and before != report.life:
            self.restarts += 1
            log.warning("shard rounds: %s restarted; its batches after %d are taken back", name, report.durable)
            self.fleet.restart(name, report.durable)
        else:
            self.fleet.durable(name, report.durable)

    async def _recall(self) -> bool:
        """A runner's first round: the newest figures a shard adopted (none: the fleet starts here).
        False when no shard answered: asked again next round."""
        asks = (within(s.recall(), self.timeout_s) for s in self.shards)
        answers = await asyncio.gather(*asks, return_exceptions=True)
        known = [a for a in answers if not isinstance(a, BaseException)]
        if not known:
            return False
        newest = max(known, key=lambda last: last.number)
        self.fleet.figures, self.fleet.combined = dict(newest.figures), dict(newest.combined)
        self.number = newest.number
        return True

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
