"""What the scheduler does when a worker goes away or comes back: requests put back in their queues,
requests lost, re-announced ones adopted and charged only what is new, ended ones settled once. A
part of ``FairScheduler``, kept apart because it is the path of failures, not of every request."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from fairgate.core.model import Request, start_need


@dataclass(frozen=True, slots=True)
class LeaveResult:
    """What a departing worker left behind: requests put back in their queues, and requests lost."""

    requeued: list[str]
    lost: list[str]


class WorkerRecovery:
    """Worker departures, re-announcements and late settlements of a ``FairScheduler``."""

    def worker_leave(self, worker_id: str) -> LeaveResult:
        """A worker is gone. Requests it had not started go back to the head of their queues, their
        dispatch charge refunded; requests that had started end as lost (what they were charged is kept,
        so that the worker re-announcing them after a broken stream charges only what is new)."""
        self.workers.leave(worker_id)
        self.prefixes.leave(worker_id)
        mine = sorted((r for r in self.state.in_flight.values() if r.worker == worker_id), key=lambda r: -r.seq)
        requeued: list[str] = []
        lost: list[str] = []
        for req in mine:
            if not req.started:
                self.requeue(req.id)
                requeued.append(req.id)
                continue
            t = self.tenants[req.tenant]
            before = self._key_if_waiting(t)
            del self.state.in_flight[req.id]
            self._settle_prediction(t, req)  # it ends here: a prediction it never reached is not kept
            t.in_flight -= 1
            t.finished += 1
            self._rekey_if_lower(t, before)
            self.state.settled[req.id] = (
                req.prompt_tokens,
                req.output_tokens,
                req.charged_output,
                req.weight,
                req.path,
            )
            lost.append(req.id)
        requeued.reverse()
        return LeaveResult(requeued, lost)

    def requeue(self, request_id: str) -> bool:
        """An assigned request that never started (its worker died, or its caller could not reach the
        worker) goes back to the head of its tenant's queue with its dispatch charge refunded."""
        req = self.state.in_flight.get(request_id)
        taken_back = self.revoking.pop(request_id, None) is not None  # its caller may ask before its worker says
        if req is None or req.started:
            return False
        self._unhold(req)
        t = self.tenants[req.tenant]
        t.revoked += taken_back
        before = self._key_if_waiting(t)
        del self.state.in_flight[request_id]
        t.in_flight -= 1
        self._release(req)
        self._refund_dispatch(t, req)
        self.quotas.release(request_id)
        req.worker, req.dispatched_at, req.predicted, req.charged_output = None, None, 0, 0
        t.queue.appendleft(req)
        if req.prefix and self._slack > 0:
            self.continuations.wait(req)
        if req.urgent:
            self.urgent_waiting[t.name] = t
        if before is None:  # it waits again, ahead of everything it sent later, as it did before
            self.tree.join(t, lift=False)
            self.tree.rekey_ancestors(t)  # the refund lowered the counters above it
        else:
            self._rekey_if_lower(t, before)
        t.queued_tokens += req.prompt_tokens + req.max_tokens
        self.state.queued_ids[req.id] = t.name
        if self.config.max_queue_s is not None:  # it waits again, still counted from its arrival
            heapq.heappush(self.state.arrivals, (req.arrival, req.seq, req.id))
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
        slot = self.workers.get(worker_id)
        known = self.state.in_flight.get(request_id)
        if known is not None and known.worker == worker_id and output_tokens > known.output_tokens:
            self.on_report(worker_id, {request_id: output_tokens - known.output_tokens})
        if slot is None or known is not None:
            return False
        if request_id in self.state.queued_ids:  # a copy re-queued meanwhile: the original runs
            self.cancel(request_id)
        t = self.tenants.get(tenant) or self._leaf_named(tenant)
        settled = self.state.settled.pop(request_id, None)
        before_p, before_out, before_charged, weight, path = settled or (0, 0, 0, t.weight, None)
        if path is None:  # charged afresh: to the nodes above it now
            path = tuple((node.name, node.weight) for node in t.ancestors)
        known = settled is not None  # charged before, even if only h(0, 0) (an empty prompt, no output yet)
        charged = max(output_tokens, before_charged)
        self.ledger.account(
            t,
            ((before_p, before_out) if known else None, (prompt_tokens, output_tokens)),
            ((before_p, before_charged) if known else None, (prompt_tokens, charged)),
            path=path,  # where its earlier charges went, at those weights
        )
        t.output_tokens += max(0, output_tokens - before_out)
        length = max(max_tokens, output_tokens, 1)
        need = start_need(prompt_tokens)
        req = Request(request_id, tenant, prompt_tokens, length, 0.0, self.state.next_seq, need)
        self.state.next_seq += 1
        req.worker, req.started, req.weight = worker_id, True, weight  # a prediction's refund: its weight
        req.path = path
        req.output_tokens, req.charged_output = output_tokens, charged
        req.adapter = adapter
        slot.committed += need
        slot.in_flight += 1
        slot.hold_adapter(adapter)
        t.in_flight += 1
        self.state.in_flight[request_id] = req
        if self.quotas and not self.quotas.holding(request_id):  # its quotas learn of it now, and hold it
            self.quotas.hold(request_id, self.quota_names(t), self._most(prompt_tokens, length), now)
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
        req = self.state.in_flight.get(request_id)
        if req is not None and req.worker == worker_id:
            if output_tokens > req.output_tokens:
                self.on_report(worker_id, {request_id: output_tokens - req.output_tokens})
            self.on_finish(request_id, output_tokens, "stop", now)
            return True
        state = self.state
        unsaved_window = False
        if req is None and request_id not in state.settled and request_id not in state.queued_ids:
            if request_id in state.recovered:
                return False  # finished here before: nothing to do
            if request_id not in state.unstarted_at_save:  # that one was saved as refunded: never counted
                unsaved = state.unsaved
                if unsaved is None or assigned_at is None or not unsaved[0] <= assigned_at < unsaved[1]:
                    return False  # counted in the state restored, or assigned and finished here
            unsaved_window = True
        if req is not None:
            if req.started:
                return False  # it runs elsewhere: that worker reports it
            self.on_finish(request_id, 0, "abort", now)  # a copy placed elsewhere that never started
        if not self.adopt(worker_id, request_id, tenant, prompt_tokens, max_tokens, output_tokens, now):
            return False
        self.on_finish(request_id, output_tokens, "stop", now)
        if unsaved_window:
            state.recovered.add(request_id)
        return True
