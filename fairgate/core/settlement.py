"""Settlement: the charges of a request from its dispatch to its end. What each engine step reports
(starts with their exact prompt and cached counts, tokens generated, free KV) is charged to the
tenants through the ledger, and a finished request's books are closed (an unused prediction refunded, a
dispatch that produced nothing undone, its worker's room given back). Kept apart because it is the
path of the engines' reports, not of decisions."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fairgate.core.in_flight import InFlight
from fairgate.core.ledger import Ledger
from fairgate.core.model import Request, Tenant
from fairgate.core.objectives import Objectives
from fairgate.core.openings import BudgetUse
from fairgate.core.policies import FairnessPolicy
from fairgate.core.predictors import MovingAveragePredictor
from fairgate.core.prefix_index import PrefixIndex
from fairgate.core.quota_gate import QuotaGate
from fairgate.core.revocation import Revocation
from fairgate.core.tenant_book import TenantBook
from fairgate.core.workers import WorkerSlot, WorkerTable

FOOTPRINT_HEADROOM = 1.5  # a footprint covers half as much again as the tenant's recent mean output


class Settlement:
    """Charges at dispatch, per engine step and at the end; what finished requests teach (their
    tenants' usual output and share of ``max_tokens`` used)."""

    __slots__ = (
        "_book",
        "_in_flight",
        "_objectives",
        "_policy",
        "_prefixes",
        "_quotas",
        "_revocation",
        "_workers",
        "budget",
        "ledger",
        "lengths",
    )

    def __init__(
        self,
        ledger: Ledger,
        book: TenantBook,
        in_flight: InFlight,
        workers: WorkerTable,
        prefixes: PrefixIndex,
        revocation: Revocation,
        objectives: Objectives,
        quotas: QuotaGate,
        lengths: MovingAveragePredictor,
        budget: BudgetUse,
    ) -> None:
        self.ledger = ledger
        self._book = book
        self._policy: FairnessPolicy = book.policy
        self._in_flight = in_flight
        self._workers = workers
        self._prefixes = prefixes
        self._revocation = revocation
        self._objectives = objectives
        self._quotas = quotas
        self.lengths = lengths  # what each tenant's requests generate: their footprints
        self.budget = budget  # how much of their max_tokens they use: when running ones end

    # ------------------------------------------------------------------ dispatch

    def charge_dispatch(self, t: Tenant, req: Request, slot: WorkerSlot) -> float:
        """Charge ``req``'s dispatch to ``slot``: its prompt (less what ``slot`` is expected to hold of it
        in its prefix cache) and the output the policy charges ahead. Returns ``t``'s counter before."""
        predicted = self._policy.predict(t, req)  # output charged ahead, with the prompt
        counter_before = t.counter
        n_p = req.prompt_tokens
        self.ledger.account(t, (None, (n_p, 0)), (None, (n_p, predicted)) if predicted else None)
        req.predicted = req.charged_output = predicted
        req.weight = t.weight
        req.path = tuple((node.name, node.weight) for node in t.ancestors)  # where refunds go back to
        if req.prefix:
            expected = self._prefixes.expected_tokens(slot.id, req.prefix, req.block_tokens)
            req.cached = cacheable(expected, n_p)
            self.ledger.account_cached(t, 0, req.cached, t.weight)
            self._prefixes.dispatched(slot.id, req.prefix, req.block_tokens)
        return counter_before

    def footprint(self, req: Request) -> int:
        """The KV ``req`` is expected to reach: its prompt and its tenant's usual output, at least what
        its requests in flight already reached."""
        guess = self.lengths.predict(req.tenant, req.max_tokens, None)  # 0: nothing known yet
        output = min(req.max_tokens, math.ceil(guess * FOOTPRINT_HEADROOM)) if guess else req.max_tokens
        return req.prompt_tokens + min(req.max_tokens, max(output, self._book.tenants[req.tenant].outgrown))

    # ------------------------------------------------------------------ engine steps

    def on_report(
        self,
        worker_id: str,
        new_tokens: Mapping[str, int],
        *,
        started: Mapping[str, int] | None = None,
        free_tokens: int | None = None,
        running: int | None = None,
        waiting: int | None = None,
        cached: Mapping[str, int] | None = None,
        now: float | None = None,
        adapters: tuple[str, ...] | None = None,
        host_adapters: tuple[str, ...] | None = None,
        kv_events: Sequence[tuple[str, str, Sequence[int]]] | None = None,
    ) -> None:
        """One engine step of one worker (``FairScheduler.on_report``)."""
        if kv_events:
            self._prefixes.apply_events(worker_id, kv_events)
        in_flight = self._in_flight
        if started:
            for rid, prompt_tokens in started.items():
                req = in_flight.get(rid)
                if req is not None and not req.started and req.worker == worker_id:
                    self._mark_started(req, prompt_tokens, None if cached is None else cached.get(rid))
        tenants, ledger = self._book.tenants, self.ledger
        for rid, k in new_tokens.items():
            req = in_flight.get(rid)
            if req is None or k <= 0 or req.worker != worker_id:  # another worker's: a stale copy here
                continue
            if not req.started:
                self._mark_started(req, req.prompt_tokens)
            t = tenants[req.tenant]
            t.output_tokens += k
            n_p, old, charged = req.prompt_tokens, req.output_tokens, req.charged_output
            new = old + k
            if old == 0 and now is not None:
                self._objectives.first_output(req, now)
            if n_p + new > req.footprint:  # it outgrew what was expected of it
                self._outgrow(req, t, n_p + new)
            if charged == old:  # nothing charged ahead: the counter moves with the service
                ledger.account(t, ((n_p, old), (n_p, new)))
                req.output_tokens = req.charged_output = new
                continue
            reached = new if new > charged else charged  # tokens within a prediction were charged ahead
            ledger.account(t, ((n_p, old), (n_p, new)), ((n_p, charged), (n_p, reached)))
            req.output_tokens, req.charged_output = new, reached
        slot = self._workers.get(worker_id)
        if slot is not None:
            slot.reported(free_tokens, running, waiting, len(started) if started else 0, adapters, host_adapters)

    def report_total(self, req: Request, output_tokens: int) -> None:
        """``req`` is known to have generated ``output_tokens`` in all: the tokens not reported yet are."""
        if output_tokens > req.output_tokens:
            self.on_report(req.worker or "", {req.id: output_tokens - req.output_tokens})

    def _outgrow(self, req: Request, t: Tenant, reached: int) -> None:
        """A request in flight went past its footprint: its worker's expected KV grows with it, and the
        tenant's next requests are expected to reach at least as far (a tenant teaching the estimate
        short outputs, then sending long ones, is caught as they run, not when they end)."""
        slot = self._workers.get(req.worker or "")
        if slot is not None:
            slot.expected += reached - req.footprint
        req.footprint = reached
        t.outgrown = max(t.outgrown, reached - req.prompt_tokens)

    def _mark_started(self, req: Request, prompt_tokens: int, cached: int | None = None) -> None:
        req.started = True
        self._revocation.unhold(req)
        slot = self._workers.get(req.worker or "")
        if cached is not None:
            self._correct_cached(req, cacheable(cached, prompt_tokens))
        t = self._book.tenants[req.tenant]
        t.prompt_tokens += prompt_tokens
        t.cached_tokens += req.cached
        grew = prompt_tokens - req.prompt_tokens
        if grew:  # the engine's exact count replaces the estimate
            before = self._book.key_if_waiting(t)
            old, out, charged = req.prompt_tokens, req.output_tokens, req.charged_output
            move = ((old, out), (prompt_tokens, out)), ((old, charged), (prompt_tokens, charged))
            self.ledger.account(t, *move, req.weight, req.path)
            req.prompt_tokens = prompt_tokens
            req.need += grew
            self._book.rekey_if_lower(t, before)
        if slot is not None:
            slot.started(req, prompt_tokens, grew)
        req.beyond_room = False

    def _correct_cached(self, req: Request, exact: int) -> None:
        """The engine's exact cached count replaces the expectation (in the charge and the index)."""
        if req.prefix and req.worker:
            self._prefixes.observed(req.worker, req.cached, exact, req.block_tokens)
        if exact != req.cached:
            t = self._book.tenants[req.tenant]
            before = self._book.key_if_waiting(t)
            self.ledger.account_cached(t, req.cached, exact, req.weight, req.path)
            req.cached = exact
            self._book.rekey_if_lower(t, before)

    # ------------------------------------------------------------------ ends

    def finish(self, request_id: str, output_tokens: int, now: float) -> Request | None:
        """A request ended on its worker with ``output_tokens``: settle its charges, free what it held
        there and learn from it. None: not in flight here."""
        self._revocation.answered(request_id)
        req = self._in_flight.get(request_id)
        if req is None:
            return None
        self._revocation.unhold(req)
        self.report_total(req, output_tokens)
        self._in_flight.remove(request_id)
        t = self._book.tenants[req.tenant]
        before = self._book.key_if_waiting(t)
        if not req.started and req.output_tokens == 0:
            self.refund_dispatch(t, req)
            self._quotas.release(request_id)
        else:
            self.settle_prediction(t, req)
            self._quotas.settle(req, t, now)
        self.release(req)
        t.in_flight -= 1
        t.finished += 1
        if not t.in_flight:
            t.outgrown = 0
        self._book.rekey_if_lower(t, before)
        if req.started:  # an aborted request teaches too: what it generated is what it used
            self._policy.observe(req.tenant, req.output_tokens)
            self.lengths.observe(req.tenant, req.output_tokens)
            self.budget.observe(req.tenant, req.output_tokens, req.max_tokens)
        return req

    def release(self, req: Request) -> None:
        """What ``req`` held on its worker is free again."""
        slot = self._workers.get(req.worker or "")
        if slot is not None:
            slot.released(req)

    def refund_dispatch(self, t: Tenant, req: Request) -> None:
        """Undo a dispatch that produced nothing: the request was never served (the caller re-keys)."""
        n_p = req.prompt_tokens
        self.ledger.account(t, ((n_p, 0), None), ((n_p, req.charged_output), None), req.weight, req.path)
        self.ledger.account_cached(t, req.cached, 0, req.weight, req.path)
        req.cached = 0

    def settle_prediction(self, t: Tenant, req: Request) -> None:
        """A request that ends (or is lost) short of its prediction gets the unused part back, at the
        weight it was charged at (its dispatch)."""
        if req.charged_output > req.output_tokens:
            served = (req.prompt_tokens, req.output_tokens)
            charged = ((req.prompt_tokens, req.charged_output), served)
            self.ledger.account(t, (served, served), charged, req.weight, req.path)
            req.charged_output = req.output_tokens

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, Any]:
        return {"served": self.ledger.total, "lengths": self.lengths.snapshot(), "budget": self.budget.snapshot()}

    def restore(self, data: Mapping[str, Any]) -> None:
        self.ledger.total = float(data["served"])
        self.lengths.restore(dict(data["lengths"]))
        self.budget.restore(dict(data["budget"]))


def cacheable(cached: int, prompt_tokens: int) -> int:
    """Cached tokens a prompt can have: the engine computes at least its last token."""
    return max(0, min(cached, prompt_tokens - 1))
