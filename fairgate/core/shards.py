"""Several dispatchers, one fairness: what dispatcher shards exchange (pure).

Each shard is a whole scheduler over its own slice of the workers; it charges exactly what its own
workers serve. The tenants' and tree nodes' figures (service, counter, lifted) are the fleet's: every
round (each ``tau``) each shard sends what it changed of them since the last round
(``ShardView.changes``), every shard combines all shards' changes the same way (``combine``), and
adopts the result with its own changes since it sent on top (``ShardView.adopt``). Between rounds a
shard misses at most what the others charged in one round: the staleness term of the fleet's bound
(``sharded_bound``).

Waiting requests are spread over the shards too (``deal``): each round, every tenant's waiting
requests are dealt to the shards in proportion to their capacity, so a shard that frees room finds
every backlogged tenant in its own queue, whichever shard its requests reached (a tenant whose
traffic reaches one shard only is served by all of them), and no shard idles while another holds
waiting work for more than one round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Figures = tuple[float, float, float]  # (service, counter, lifted) of a tenant ("t/name") or tree node ("n/name")
ZERO: Figures = (0.0, 0.0, 0.0)


def combine(base: Mapping[str, Figures], changes: Sequence[Mapping[str, Figures]]) -> dict[str, Figures]:
    """The fleet's figures after a round: ``base`` (the last round's) and every shard's changes since.
    Service and charges add up; lifts do not (each shard lifts a tenant that joins its queue to the
    same floor, the least-served waiting): the largest lift of the round counts, once."""
    fleet = dict(base)
    for key in {key for change in changes for key in change}:
        moves = [change[key] for change in changes if key in change]
        service, counter, lifted = base.get(key, ZERO)
        lift = max(0.0, max(m[2] for m in moves))
        charged = sum(m[1] - m[2] for m in moves)
        fleet[key] = (service + sum(m[0] for m in moves), counter + charged + lift, lifted + lift)
    return fleet


@dataclass(frozen=True)
class ShardReport:
    """A shard's answer in a round: its change batches not yet combined, its waiting requests per
    tenant, its capacity (workers taking work), which life of it this is (a restarted shard has a new
    ``life``) and its last batch held by a durable state it saved."""

    batches: list[tuple[int, dict[str, Figures]]]
    waiting: dict[str, int]
    capacity: int
    life: str = ""
    durable: int = 0


@dataclass(frozen=True)
class LastRound:
    """The fleet's figures after round ``number``, and each shard's last batch combined into them."""

    number: int
    figures: Mapping[str, Figures]
    combined: Mapping[str, int]


class FigureSource(Protocol):
    """What a shard's scheduler gives and takes in a round (``FairScheduler`` is one)."""

    def member_figures(self) -> dict[str, Figures]: ...

    def adopt_figures(self, figures: Mapping[str, Figures], waiting_elsewhere: Iterable[str]) -> None: ...


class ShardView:
    """One shard's side of the rounds: its own changes not sent yet, measured from the figures it last
    had after sending or adopting. A shard may adopt several times between two sends (the fleet's
    figures arriving in parts): its unsent changes stay on top of each."""

    def __init__(self, scheduler: FigureSource, known: bool = False) -> None:
        """``known``: the scheduler's figures now are already the fleet's (a restored shard's)."""
        self._scheduler = scheduler
        # the scheduler's figures when last sent or adopted
        self._known: dict[str, Figures] = scheduler.member_figures() if known else {}
        self._unsent: dict[str, Figures] = {}  # this shard's own changes since its last send

    def changes(self) -> dict[str, Figures]:
        """This shard's changes since its last send, for every shard (itself included) to combine."""
        self._note_own()
        out = {key: f for key, f in self._unsent.items() if f != ZERO}
        self._unsent = {}
        return out

    def adopt(self, fleet: Mapping[str, Figures], waiting_elsewhere: Iterable[str]) -> None:
        """Take the fleet's figures, with this shard's changes not sent yet on top; ``waiting_elsewhere``:
        the tenants other shards hold waiting requests of (one that joins this shard's queue is not
        lifted: it waited all along)."""
        self._note_own()
        unsent = self._unsent
        view = {key: _plus(f, unsent[key]) if key in unsent else f for key, f in fleet.items()}
        self._scheduler.adopt_figures(view, waiting_elsewhere)
        self._known = self._scheduler.member_figures()

    def state(self) -> dict[str, Any]:
        """What was known and what was not sent yet, as a durable state keeps them."""
        self._note_own()
        return {"known": _rows(self._known), "unsent": _rows(self._unsent)}

    def resume(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``, saved with the durable state the scheduler was restored from."""
        self._known = _figures(state["known"])
        self._unsent = _figures(state["unsent"])

    def attach(self, scheduler: FigureSource) -> None:
        """A restarted shard's scheduler, restored with the figures this one had: the rounds' state
        (what was known, what was not sent yet) is kept with its durable state."""
        self._scheduler = scheduler

    def _note_own(self) -> None:
        """Add what the scheduler changed since the figures were last known to the unsent changes."""
        now, known, unsent = self._scheduler.member_figures(), self._known, self._unsent
        for key, f in now.items():
            before = known.get(key, ZERO)
            if f != before:
                unsent[key] = _plus(unsent.get(key, ZERO), _minus(f, before))
        self._known = now


class ShardSender:
    """A shard's side of rounds over links that may lose a reply: its changes in numbered batches, each
    kept until the fleet's figures it adopts say that batch was combined (so a batch sent twice is
    combined once, and a batch whose round was lost goes in the next)."""

    def __init__(self, scheduler: FigureSource, known: bool = False) -> None:
        """``known``: the scheduler's figures now are already the fleet's (a restored shard's)."""
        self._view = ShardView(scheduler, known)
        self._seq = 0
        self._unacked: list[tuple[int, dict[str, Figures]]] = []

    @property
    def seq(self) -> int:
        """The number of the last batch made: a durable state saved now holds every change up to it."""
        return self._seq

    def state(self) -> dict[str, Any]:
        """The rounds' state, saved with the scheduler's durable state (taken at the same moment)."""
        return {
            "seq": self._seq,
            "unacked": [[n, _rows(batch)] for n, batch in self._unacked],
            **self._view.state(),
        }

    @classmethod
    def restored(cls, scheduler: FigureSource, state: Mapping[str, Any] | None) -> ShardSender:
        """A restarted shard's sender, from ``state`` saved with the durable state its scheduler was
        restored from (none saved: the restored figures are taken as the fleet's)."""
        sender = cls(scheduler, known=True)
        if state:
            sender._seq = int(state["seq"])
            sender._unacked = [(int(n), _figures(batch)) for n, batch in state["unacked"]]
            sender._view.resume(state)
        return sender

    def batches(self) -> list[tuple[int, dict[str, Figures]]]:
        """Every batch not yet combined, this round's changes the last."""
        changes = self._view.changes()
        if changes:
            self._seq += 1
            self._unacked.append((self._seq, changes))
        return list(self._unacked)

    def adopt(self, fleet: Mapping[str, Figures], waiting_elsewhere: Iterable[str], combined: int) -> None:
        """The fleet's figures, which include this shard's batches up to number ``combined``."""
        self._unacked = [(n, batch) for n, batch in self._unacked if n > combined]
        self._view.adopt(fleet, waiting_elsewhere)

    def attach(self, scheduler: FigureSource) -> None:
        """A restarted shard's scheduler, restored with the figures this one had (``ShardView.attach``)."""
        self._view.attach(scheduler)


class FleetFigures:
    """The fleet's figures as the rounds' runner keeps them: each shard's batches combined once, in
    the order the shard numbered them; within a round, each shard's batches add up (its own lifts came
    one after another), and the shards' changes combine by ``combine``."""

    def __init__(self) -> None:
        self.figures: dict[str, Figures] = {}
        self.combined: dict[str, int] = {}  # shard -> the last batch number combined
        # shard -> its batches combined since its last durable state: what it may take back (``restart``)
        self.recent: dict[str, list[tuple[int, Mapping[str, Figures]]]] = {}

    def round(self, sent: Mapping[str, Sequence[tuple[int, Mapping[str, Figures]]]]) -> None:
        """Combine what each shard (by name) sent this round that was not combined before."""
        changes = []
        for shard, batches in sent.items():
            done = self.combined.get(shard, 0)
            fresh = [(n, batch) for n, batch in batches if n > done]
            if not fresh:
                continue
            merged: dict[str, Figures] = {}
            for _, batch in fresh:
                for key, f in batch.items():
                    merged[key] = _plus(merged.get(key, ZERO), f)
            changes.append(merged)
            self.combined[shard] = max(n for n, _ in fresh)
            self.recent.setdefault(shard, []).extend(fresh)
        self.figures = combine(self.figures, changes)

    def durable(self, shard: str, upto: int) -> None:
        """``shard`` has saved a durable state holding its batches up to ``upto``: those stay."""
        self.recent[shard] = [(n, batch) for n, batch in self.recent.get(shard, []) if n > upto]

    def restart(self, shard: str, restored: int) -> None:
        """``shard`` restarted from a durable state holding its batches up to ``restored``: its batches
        combined since are taken back (its workers report that work again, and it charges it again),
        and its next batches are numbered on from ``restored``. A lift taken back stays: it was a
        floor every shard agreed on."""
        taken = [batch for n, batch in self.recent.pop(shard, []) if n > restored]
        for batch in taken:
            for key, (service, counter, lifted) in batch.items():
                s, c, lift = self.figures.get(key, ZERO)
                self.figures[key] = (s - service, c - (counter - lifted), lift)
        # its batches up to ``restored`` not combined yet are still with it, and go in a later round
        self.combined[shard] = min(self.combined.get(shard, 0), restored)


def deal(counts: Sequence[int], shares: Sequence[float]) -> list[tuple[int, int, int]]:
    """Moves ``(from shard, to shard, requests)`` that spread one tenant's waiting requests (``counts``
    per shard) in proportion to ``shares`` (the shards' capacities). Each move costs its caller a
    redirect, so a shard is dealt requests only when it holds less than half its share (none: it
    cannot serve the tenant at all until the next round), and then up to its share, from the shards
    holding more than theirs; what does not divide evenly stays where it is."""
    total, weight = sum(counts), sum(shares)
    if total == 0 or weight <= 0:
        return []
    target = [int(total * s / weight) for s in shares]
    left = total - sum(target)
    for i in sorted(range(len(counts)), key=lambda i: target[i] - counts[i])[:left]:  # the most held, first
        target[i] += 1
    give = [(i, counts[i] - target[i]) for i in range(len(counts)) if counts[i] > target[i]]
    take = [(i, target[i] - counts[i]) for i in range(len(counts)) if 2 * counts[i] < target[i]]
    moves: list[tuple[int, int, int]] = []
    while give and take:
        (src, extra), (dst, short) = give[-1], take[-1]
        n = min(extra, short)
        moves.append((src, dst, n))
        give[-1], take[-1] = (src, extra - n), (dst, short - n)
        if extra == n:
            give.pop()
        if short == n:
            take.pop()
    return moves


def deals(waiting: Sequence[Mapping[str, int]], shares: Sequence[float]) -> list[tuple[str, int, int, int]]:
    """Moves ``(tenant, from shard, to shard, requests)`` of a round: every tenant's waiting requests
    (``waiting``: per shard, by tenant) dealt by ``deal``."""
    moves = []
    for tenant in sorted({t for counts in waiting for t in counts}):
        counts = [w.get(tenant, 0) for w in waiting]
        moves += [(tenant, src, dst, n) for src, dst, n in deal(counts, shares)]
    return moves


def sharded_bound(single: float, round_service: float, shards: int) -> float:
    """The fleet's bound on the service gap between two backlogged tenants (weight 1) with ``shards``
    shards: ``single`` (a single dispatcher's over the whole fleet: 2U and its terms) plus twice the
    most the whole fleet serves in one round (``round_service``: at most its service rate times tau).
    A shard picks by counters that miss at most what the other shards charged since the last round,
    and its queue may lack, until the next round, a tenant that waits elsewhere; each costs the pair
    at most one round's service of the fleet on one side."""
    return single if shards <= 1 else single + 2.0 * round_service


def _rows(figures: Mapping[str, Figures]) -> dict[str, list[float]]:
    """Figures as a durable state keeps them (JSON: lists)."""
    return {key: list(f) for key, f in figures.items()}


def _figures(rows: Mapping[str, Sequence[float]]) -> dict[str, Figures]:
    return {key: (float(r[0]), float(r[1]), float(r[2])) for key, r in rows.items()}


def _minus(a: Figures, b: Figures) -> Figures:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


def _plus(a: Figures, b: Figures) -> Figures:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])
