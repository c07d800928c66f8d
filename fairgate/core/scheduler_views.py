"""What the scheduler shows of itself: queue and flight views, the bound and the gaps it is checked
against, the autoscaler's demand, stats for the live page, and snapshots. A part of
``FairScheduler``: reads only, but for the snapshot calls (``fairgate.core.snapshots``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from fairgate.core import snapshots
from fairgate.core.capacity import Demand
from fairgate.core.fairness import engine_queue_slack, in_flight_reach, unit_u
from fairgate.core.model import Request, start_need
from fairgate.core.quotas import Refusal

S = TypeVar("S")


class SchedulerViews:
    """Read-only views of a ``FairScheduler``, and its snapshots."""

    def is_backlogged(self, tenant: str) -> bool:
        t = self.tenants.get(tenant)
        return t is not None and bool(t.queue)

    def next_in_line(self) -> Request | None:
        """The request the policy would dispatch next: what ``assign`` tries to place first."""
        top = self.tree.pick()
        return None if top is None else self.policy.next_request(top[1])

    def waiting_tenants(self) -> list[str]:
        """Tenants (leaves) with waiting requests."""
        if not self.tree.nodes and not self.tree.strict.kids:
            return list(self._waiting)
        return [t.name for t in self.tenants.values() if t.queue]

    def was_lost(self, request_id: str) -> bool:
        """Whether the request had started on a worker that left (it must not run a second time)."""
        return request_id in self.state.settled

    def is_queued(self, request_id: str) -> bool:
        return request_id in self.state.queued_ids

    def queue_depth(self) -> int:
        return len(self.state.queued_ids)

    def in_flight(self) -> dict[str, Request]:
        return self.state.in_flight

    def take_dropped(self) -> list[tuple[Request, str]]:
        """Requests removed from the queues because they can never fit (e.g. the big workers left), or
        no longer fit a quota when their turn came (``dropped_refusal`` says which, until the next take)."""
        dropped, self.dropped = self.dropped, []
        self._taken_refusals, self._drop_refusals = self._drop_refusals, {}
        return dropped

    def dropped_refusal(self, request_id: str) -> Refusal | None:
        """The quota refusal of a request the last ``take_dropped`` returned, if a quota dropped it."""
        return self._taken_refusals.get(request_id)

    def fits_now(self, prompt_tokens: int, max_tokens: int) -> bool:
        """Whether a request of this size would start at once (no one waiting, a worker has room)."""
        return not self.tree.any_waiting() and self.workers.place(start_need(prompt_tokens)) is not None

    def sibling_gaps(self) -> dict[str, float]:
        """Per tree node ("": the root), the largest counter gap between its backlogged children:
        siblings are what the bound compares (counters of different parents are not comparable)."""
        tree = self.tree
        gaps: dict[str, float] = {}
        for node in (tree.root, *tree.nodes.values()):
            entries = node.waiting.entries()  # type: ignore[union-attr]
            if len(entries) < 2:
                continue
            counters = [node.kids[name].counter for name, _ in entries]
            gaps[node.name] = max(counters) - min(counters)
        return gaps

    def fairness_bound(self) -> float:
        """The bound on the service gap between two backlogged tenants (weight 1) for the requests seen
        so far on the workers taking work now (the live page's): VTC's 2U (the policy's own, e.g.
        2U + Δ, where it states one) plus what the engines' queues can add."""
        active = [w for w in self.workers.slots.values() if not w.draining]
        pool = sum(w.kv_tokens for w in active)
        return self.bound_for(self.longest_prompt, self.longest_output, pool, len(active))

    def bound_for(self, longest_prompt: int, longest_output: int, pool: int, engines: int) -> float:
        """The stated bound for requests of these sizes on ``engines`` engines of ``pool`` KV tokens in
        all: the policy's own (2U + Δ with locality slack), else VTC's 2U, plus the engines' queues."""
        u = unit_u(self.cost, longest_prompt, longest_output, in_flight_reach(pool, self.config.overcommit))
        stated = self.policy.bound(u)
        queued = self.config.max_engine_waiting * engines
        return (2.0 * u if stated is None else stated) + engine_queue_slack(self.cost, longest_prompt, queued)

    def demand(self) -> Demand:
        """Running and waiting load against the workers taking work (the autoscaler's input)."""
        slots = self.workers.slots.values()
        active = [w for w in slots if not w.draining]
        limits = [w.max_running for w in active if w.max_running]
        return Demand(
            queued_requests=len(self.state.queued_ids),
            queued_tokens=sum(t.queued_tokens for t in self.tenants.values() if t.queue),
            running_requests=len(self.state.in_flight),
            committed_tokens=sum(max(0, w.kv_tokens - w.free_tokens) + w.pending_tokens for w in slots),
            workers=len(active),
            pool_tokens=sum(w.kv_tokens for w in active) // len(active) if active else 0,
            max_running=min(limits) if limits else 0,
        )

    def stats(self) -> dict[str, Any]:
        return {
            "tenants": {
                t.name: {
                    "weight": t.weight,
                    "counter": t.counter,
                    "service": t.service,
                    "lifted": t.lifted,
                    "queued": len(t.queue),
                    "queued_tokens": t.queued_tokens,
                    "in_flight": t.in_flight,
                    "submitted": t.submitted,
                    "rejected": t.rejected,
                    "revoked": t.revoked,
                    "finished": t.finished,
                    "output_tokens": t.output_tokens,
                    "prompt_tokens": t.prompt_tokens,
                    "cached_tokens": t.cached_tokens,
                    "parent": t.parent,
                }
                for t in self.tenants.values()
            },
            "nodes": {
                n.name: {
                    "weight": n.weight,
                    "parent": n.parent,
                    "counter": n.counter,
                    "service": n.service,
                    "waiting": len(n.waiting) > 0,  # type: ignore[arg-type]
                    "implicit": n.implicit,
                }
                for n in self.tree.nodes.values()
            },
            "queue_depth": self.queue_depth(),
            "in_flight": len(self.state.in_flight),
            "workers": self.workers.snapshot(),
        }

    # --------------------------------------------------------------- snapshots

    def snapshot(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this scheduler is, as JSON-able data."""
        return snapshots.snapshot(self)

    @classmethod
    def from_snapshot(cls: type[S], data: Mapping[str, Any]) -> S:
        """A scheduler that continues exactly where ``snapshot`` was taken."""
        s = cls(snapshots.check_snapshot(data))  # type: ignore[call-arg]
        snapshots.restore_snapshot(s, data)  # type: ignore[arg-type]
        return s

    def durable_state(self, saved_at: float | None = None) -> dict[str, Any]:
        """What a restarted dispatcher needs to continue fairly (``fairgate.core.snapshots``)."""
        return snapshots.durable_state(self, saved_at)

    def restore_durable(self, data: Mapping[str, Any], now: float | None = None) -> None:
        """Continue from ``durable_state`` (on a fresh scheduler, before any request or worker)."""
        snapshots.restore_durable(self, data, now)

    def started_ids(self) -> list[str]:
        """Requests that ran and may still be announced: started and in flight, or lost with a worker."""
        state = self.state
        return [r.id for r in state.in_flight.values() if r.started] + list(state.settled)

    def forget_settled(self) -> None:
        """Drop what was kept for re-announcements and re-submissions once every worker and caller has
        had time to come back: called every so often, each call drops the settled entries that were
        already there at the one before (each is kept between one and two periods)."""
        state = self.state
        for request_id in state.settled_before:
            row = state.settled.pop(request_id, None)
            if row is not None:  # lost with its worker and never announced again: its quota hold ends
                self.quotas.settle(request_id, self._used(row[0], 0, row[1]), (), 0.0)
            state.recovered.discard(request_id)
        state.settled_before = set(state.settled) | state.recovered
        state.resumed.clear()
        state.unstarted_at_save.clear()
        self.tree.resumed.clear()
