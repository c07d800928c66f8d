"""What the scheduler does when a worker goes away or comes back, or the dispatcher restarts: requests
put back in their queues, requests lost, re-announced ones adopted and charged only what is new, ended
ones settled once. Kept apart because it is the path of failures, not of every request; it keeps what
must be remembered across them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fairgate.core.in_flight import InFlight
from fairgate.core.model import Request, start_need
from fairgate.core.objectives import Objectives
from fairgate.core.prefix_index import PrefixIndex
from fairgate.core.queues import WaitingQueues
from fairgate.core.quota_gate import QuotaGate
from fairgate.core.revocation import Revocation
from fairgate.core.settlement import Settlement
from fairgate.core.tenant_book import TenantBook
from fairgate.core.workers import WorkerTable

# what a request that ran was charged, kept for its re-announcement: prompt, output, charged output,
# the weight and tree path its charges were divided by
Settled = tuple[int, int, int, float, tuple[tuple[str, float], ...]]


@dataclass(frozen=True, slots=True)
class LeaveResult:
    """What a departing worker left behind: requests put back in their queues, and requests lost."""

    requeued: list[str]
    lost: list[str]


class Recovery:
    """Worker departures, re-announcements and late settlements, and what is kept for them: the charges
    of requests lost with a worker or running when the dispatcher stopped, and the window of
    assignments no saved state holds."""

    __slots__ = (
        "_book",
        "_in_flight",
        "_objectives",
        "_prefixes",
        "_queues",
        "_quotas",
        "_revocation",
        "_settlement",
        "_workers",
        "recovered",
        "resumed",
        "settled",
        "settled_before",
        "unsaved",
        "unstarted_at_save",
    )

    def __init__(
        self,
        book: TenantBook,
        queues: WaitingQueues,
        in_flight: InFlight,
        settlement: Settlement,
        revocation: Revocation,
        objectives: Objectives,
        quotas: QuotaGate,
        workers: WorkerTable,
        prefixes: PrefixIndex,
    ) -> None:
        self._book = book
        self._queues = queues
        self._in_flight = in_flight
        self._settlement = settlement
        self._revocation = revocation
        self._objectives = objectives
        self._quotas = quotas
        self._workers = workers
        self._prefixes = prefixes
        # id -> what a request that ran when its worker or this dispatcher went away was charged: what its
        # re-announcement is charged beyond
        self.settled: dict[str, Settled] = {}
        self.settled_before: set[str] = set()  # settled ids already there at the last sweep
        self.resumed: set[str] = set()  # tenants waiting when the durable state was written
        # [saved, restored): when the durable state this scheduler continues from was written, and when it
        # was restored; what the dispatcher before assigned in between, no saved counter holds
        self.unsaved: tuple[float, float] | None = None
        self.recovered: set[str] = set()  # ids from that window settled here (never twice)
        self.unstarted_at_save: set[str] = set()  # assigned, not started: saved as refunded

    def lifts_on_return(self, tenant: str) -> bool:
        """Whether ``tenant``, waiting again, is lifted by the policy's rule: not when it was waiting
        when the dispatcher stopped (its callers ask again: it never stopped waiting); asked once."""
        lift = tenant not in self.resumed
        self.resumed.discard(tenant)
        return lift

    def was_lost(self, request_id: str) -> bool:
        return request_id in self.settled

    # ------------------------------------------------------------------ workers going and coming back

    def worker_leave(self, worker_id: str) -> LeaveResult:
        """A worker is gone. Requests it had not started go back to the head of their queues, their
        dispatch charge refunded; requests that had started end as lost (what they were charged is kept,
        so that the worker re-announcing them after a broken stream charges only what is new)."""
        self._workers.leave(worker_id)
        self._prefixes.leave(worker_id)
        mine = sorted(self._in_flight.on_worker(worker_id), key=lambda r: -r.seq)
        requeued: list[str] = []
        lost: list[str] = []
        book = self._book
        for req in mine:
            if not req.started:
                self.requeue(req.id)
                requeued.append(req.id)
                continue
            t = book.tenants[req.tenant]
            before = book.key_if_waiting(t)
            self._in_flight.remove(req.id)
            self._settlement.settle_prediction(t, req)  # it ends here: a prediction it never reached is not kept
            t.in_flight -= 1
            t.finished += 1
            book.rekey_if_lower(t, before)
            self.settled[req.id] = (req.prompt_tokens, req.output_tokens, req.charged_output, req.weight, req.path)
            lost.append(req.id)
        requeued.reverse()
        return LeaveResult(requeued, lost)

    def requeue(self, request_id: str) -> bool:
        """An assigned request that never started (its worker died, or its caller could not reach the
        worker) goes back to the head of its tenant's queue with its dispatch charge refunded."""
        req = self._in_flight.get(request_id)
        taken_back = self._revocation.taken_back(request_id)
        if req is None or req.started:
            return False
        self._revocation.unhold(req)
        t = self._book.tenants[req.tenant]
        t.revoked += taken_back
        before = self._book.key_if_waiting(t)
        self._in_flight.remove(request_id)
        t.in_flight -= 1
        self._settlement.release(req)
        self._settlement.refund_dispatch(t, req)
        self._quotas.release(request_id)
        req.worker, req.dispatched_at, req.predicted, req.charged_output = None, None, 0, 0
        if req.urgent:
            self._objectives.waiting(t)
        self._queues.put_back(t, req, before)
        return True

    def adopt(
        self,
        worker_id: str,
        request_id: str,
        tenant: str,
        prompt_tokens: int,
        max_tokens: int,
        output_tokens: int,
        now: float = 0.0,
        adapter: str = "",
    ) -> bool:
        """A worker announces a running request this scheduler does not track (after a dispatcher
        restart, or a worker's stream that broke). It is taken into the tables and charged what it has
        consumed beyond what was charged for it before (``restore_durable`` / ``worker_leave``). One
        still tracked there (the old stream's end not seen yet) is brought to the announced count: the
        reports in between were lost. Returns whether it was taken in."""
        slot = self._workers.get(worker_id)
        known = self._in_flight.get(request_id)
        if known is not None and known.worker == worker_id:
            self._settlement.report_total(known, output_tokens)
        if slot is None or known is not None:
            return False
        self._queues.withdraw(request_id)  # a copy re-queued meanwhile: the original runs
        t = self._book.tenants.get(tenant) or self._book.leaf_named(tenant)
        settled = self.settled.pop(request_id, None)
        if settled is None:  # charged afresh: to the nodes above it now
            before_p, before_out, before_charged = 0, 0, 0
            weight, path = t.weight, tuple((node.name, node.weight) for node in t.ancestors)
        else:
            before_p, before_out, before_charged, weight, path = settled
        charged = max(output_tokens, before_charged)
        self._settlement.ledger.account(  # charged before, even if only h(0, 0) (an empty prompt, no output yet)
            t,
            ((before_p, before_out) if settled is not None else None, (prompt_tokens, output_tokens)),
            ((before_p, before_charged) if settled is not None else None, (prompt_tokens, charged)),
            path=path,  # where its earlier charges went, at those weights
        )
        t.output_tokens += max(0, output_tokens - before_out)
        length = max(max_tokens, output_tokens, 1)
        need = start_need(prompt_tokens)
        req = Request(request_id, tenant, prompt_tokens, length, 0.0, self._in_flight.take_seq(), need)
        req.worker, req.started, req.weight = worker_id, True, weight  # a prediction's refund: its weight
        req.path = path
        req.output_tokens, req.charged_output = output_tokens, charged
        req.adapter = adapter
        slot.adopted(req)
        t.in_flight += 1
        self._in_flight.add(req)
        self._quotas.hold_adopted(req, t, now)
        return True

    def settle_ended(
        self,
        worker_id: str,
        request_id: str,
        tenant: str,
        prompt_tokens: int,
        max_tokens: int,
        output_tokens: int,
        now: float,
        assigned_at: float | None = None,
    ) -> bool:
        """A worker says a request ended on it with ``output_tokens``, in a hello after its stream
        broke or this dispatcher restarted. Settle it exactly once: a request this scheduler lost
        with the worker (or put back in its queue, or placed again elsewhere without starting) is
        adopted and finished; one it still tracks there is brought to its final count and finished;
        one already finished is left alone. One it never knew, assigned (``assigned_at``) by the
        dispatcher before this one after the state this one restored was saved, or assigned before
        and not started then (saved as refunded), is in no saved counter: adopted and finished too.
        True when it was settled here."""
        settlement = self._settlement
        req = self._in_flight.get(request_id)
        if req is not None and req.worker == worker_id:
            settlement.report_total(req, output_tokens)
            settlement.finish(request_id, output_tokens, now)
            return True
        unsaved_window = False
        if req is None and request_id not in self.settled and request_id not in self._queues:
            if request_id in self.recovered:
                return False  # finished here before: nothing to do
            if request_id not in self.unstarted_at_save:  # that one was saved as refunded: never counted
                unsaved = self.unsaved
                if unsaved is None or assigned_at is None or not unsaved[0] <= assigned_at < unsaved[1]:
                    return False  # counted in the state restored, or assigned and finished here
            unsaved_window = True
        if req is not None:
            if req.started:
                return False  # it runs elsewhere: that worker reports it
            settlement.finish(request_id, 0, now)  # a copy placed elsewhere that never started
        if not self.adopt(worker_id, request_id, tenant, prompt_tokens, max_tokens, output_tokens, now):
            return False
        settlement.finish(request_id, output_tokens, now)
        if unsaved_window:
            self.recovered.add(request_id)
        return True

    def forget_settled(self) -> None:
        """Drop what was kept for re-announcements and re-submissions once every worker and caller has
        had time to come back: called every so often, each call drops the settled entries that were
        already there at the one before (each is kept between one and two periods)."""
        for request_id in self.settled_before:
            row = self.settled.pop(request_id, None)
            if row is not None:  # lost with its worker and never announced again: its quota hold ends
                self._quotas.settle_lost(request_id, row[0], row[1])
            self.recovered.discard(request_id)
        self.settled_before = set(self.settled) | self.recovered
        self.resumed.clear()
        self.unstarted_at_save.clear()
        self._book.tree.resumed.clear()

    # ------------------------------------------------------------------ the dispatcher's restart

    def continue_from(
        self,
        charged: Iterable[list[Any]],
        waiting: Iterable[str],
        unstarted: Iterable[str],
        saved_at: float | None,
        now: float | None,
    ) -> None:
        """A restarted dispatcher continues from a durable state: what its running requests were
        charged, who was waiting (their callers ask again), what was assigned and not started (saved
        as refunded) and when it was saved (``saved_at``; ``now``: when it is restored, on one clock)."""
        self.settled = settled_of(charged)
        self.resumed = {name for name in waiting if name in self._book.tenants}
        if saved_at is not None and now is not None:
            self.unsaved = (float(saved_at), now)
        self.unstarted_at_save = set(unstarted)

    # ------------------------------------------------------------------ snapshots

    def settled_rows(self) -> list[list[Any]]:
        """The settled requests as JSON-able rows: [id, prompt, output, charged output, weight, path]."""
        return [[rid, p, o, c, w, [list(step) for step in path]] for rid, (p, o, c, w, path) in self.settled.items()]

    def snapshot(self) -> dict[str, Any]:
        return {
            "settled": self.settled_rows(),
            "settled_before": sorted(self.settled_before),
            "resumed": sorted(self.resumed),
            "unsaved": None if self.unsaved is None else list(self.unsaved),
            "recovered": sorted(self.recovered),
            "unstarted_at_save": sorted(self.unstarted_at_save),
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        self.settled = settled_of(data["settled"])
        self.settled_before = set(data["settled_before"])
        self.resumed = set(data["resumed"])
        unsaved = data["unsaved"]
        self.unsaved = None if unsaved is None else (float(unsaved[0]), float(unsaved[1]))
        self.recovered = set(data["recovered"])
        self.unstarted_at_save = set(data["unstarted_at_save"])


def settled_of(rows: Iterable[list[Any]]) -> dict[str, Settled]:
    """From ``settled_rows`` (older states have no weight: 1; no path: none)."""
    return {
        str(row[0]): (
            int(row[1]),
            int(row[2]),
            int(row[3]),
            float(row[4]) if len(row) > 4 else 1.0,
            tuple((str(name), float(w)) for name, w in row[5]) if len(row) > 5 else (),
        )
        for row in rows
    }
