"""Settlement: what each engine step reports (starts with their exact prompt and cached counts, tokens
generated, free KV) charged to the tenants through the ledger, and a finished request's books closed
(an unused prediction refunded, a dispatch that produced nothing undone, its worker's room given
back). A part of ``FairScheduler``, kept apart because it is the path of the engines' reports, not of
decisions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fairgate.core.model import Request, Tenant
from fairgate.core.reasons import FINISH_REVOKED


class Settlement:
    """Reports and finishes of a ``FairScheduler``."""

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
        """One engine step of one worker: requests started (exact prompt tokens, and ``cached``: how
        many of them the engine found in its prefix cache) and tokens generated; ``now``: when it was
        received (first tokens are timed: objectives and their predictions); ``adapters``,
        ``host_adapters``: the LoRA adapters loaded on its GPU and in its host memory (None: unsaid);
        ``kv_events``: what its KV cache stored and evicted (``PrefixIndex.apply_events``)."""
        if kv_events:
            self.prefixes.apply_events(worker_id, kv_events)
        in_flight = self.state.in_flight
        if started:
            for rid, prompt_tokens in started.items():
                req = in_flight.get(rid)
                if req is not None and not req.started:
                    self._mark_started(req, prompt_tokens, None if cached is None else cached.get(rid))
        tenants, ledger = self.tenants, self.ledger
        for rid, k in new_tokens.items():
            req = in_flight.get(rid)
            if req is None or k <= 0:
                continue
            if not req.started:
                self._mark_started(req, req.prompt_tokens)
            t = tenants[req.tenant]
            t.output_tokens += k
            n_p, old, charged = req.prompt_tokens, req.output_tokens, req.charged_output
            new = old + k
            if old == 0 and now is not None:
                self._first_output(req, now)
            if n_p + new > req.footprint:  # it outgrew what was expected of it
                self._outgrow(req, t, n_p + new)
            if charged == old:  # nothing charged ahead: the counter moves with the service
                ledger.account(t, ((n_p, old), (n_p, new)))
                req.output_tokens = req.charged_output = new
                continue
            reached = new if new > charged else charged  # tokens within a prediction were charged ahead
            ledger.account(t, ((n_p, old), (n_p, new)), ((n_p, charged), (n_p, reached)))
            req.output_tokens, req.charged_output = new, reached
        slot = self.workers.slots.get(worker_id)
        if slot is not None:
            if free_tokens is not None:
                slot.free_tokens = free_tokens
                slot.observe_starts(len(started) if started else 0)
            if running is not None:
                slot.running = running
            if waiting is not None:
                slot.waiting = waiting
            if adapters is not None:
                slot.gpu_adapters = adapters
            if host_adapters is not None:
                slot.host_adapters = host_adapters

    def on_finish(self, request_id: str, output_tokens: int, reason: str, now: float) -> Request | None:
        """A request ended on its worker: settle its charges and free its reservation. One its worker
        took back unstarted (``revoked``) waits again instead (``settle_revoked``): None."""
        if reason == FINISH_REVOKED:  # it did not end: it waits again (or, started, it runs on)
            self.settle_revoked(request_id)
            return None
        self.revocation_answered(request_id)
        req = self.state.in_flight.get(request_id)
        if req is None:
            return None
        self._unhold(req)
        if output_tokens > req.output_tokens:
            self.on_report(req.worker or "", {request_id: output_tokens - req.output_tokens})
        del self.state.in_flight[request_id]
        t = self.tenants[req.tenant]
        before = self._key_if_waiting(t)
        if not req.started and req.output_tokens == 0:
            self._refund_dispatch(t, req)
            self.quotas.release(request_id)
        else:
            self._settle_prediction(t, req)
            used = self._used(req.prompt_tokens, req.cached, req.output_tokens)
            self.quotas.settle(request_id, used, self.quota_names(t), now)
        self._release(req)
        t.in_flight -= 1
        t.finished += 1
        if not t.in_flight:
            t.outgrown = 0
        self._rekey_if_lower(t, before)
        if req.started:  # an aborted request teaches too: what it generated is what it used
            self.policy.observe(req.tenant, req.output_tokens)
            self.lengths.observe(req.tenant, req.output_tokens)
            self.budget.observe(req.tenant, req.output_tokens, req.max_tokens)
        return req

    def _outgrow(self, req: Request, t: Tenant, reached: int) -> None:
        """A request in flight went past its footprint: its worker's expected KV grows with it, and the
        tenant's next requests are expected to reach at least as far (a tenant teaching the estimate
        short outputs, then sending long ones, is caught as they run, not when they end)."""
        slot = self.workers.slots.get(req.worker or "")
        if slot is not None:
            slot.expected += reached - req.footprint
        req.footprint = reached
        t.outgrown = max(t.outgrown, reached - req.prompt_tokens)

    def _mark_started(self, req: Request, prompt_tokens: int, cached: int | None = None) -> None:
        req.started = True
        self._unhold(req)
        slot = self.workers.slots.get(req.worker or "")
        if cached is not None:
            self._correct_cached(req, cacheable(cached, prompt_tokens))
        t = self.tenants[req.tenant]
        t.prompt_tokens += prompt_tokens
        t.cached_tokens += req.cached
        if slot is not None:
            slot.prompt_tokens += prompt_tokens
            slot.cached_tokens += req.cached
        if prompt_tokens != req.prompt_tokens:  # the engine's exact count replaces the estimate
            t = self.tenants[req.tenant]
            before = self._key_if_waiting(t)
            old, out, charged = req.prompt_tokens, req.output_tokens, req.charged_output
            move = ((old, out), (prompt_tokens, out)), ((old, charged), (prompt_tokens, charged))
            self.ledger.account(t, *move, req.weight, req.path)
            delta = prompt_tokens - old
            req.prompt_tokens = prompt_tokens
            req.need += delta
            if slot is not None:
                slot.committed += delta
                slot.pending_tokens += delta
            self._rekey_if_lower(t, before)
        if slot is not None:
            slot.pending_count -= 1
            slot.pending_tokens -= req.need
            slot.beyond -= req.beyond_room
        req.beyond_room = False

    def _correct_cached(self, req: Request, exact: int) -> None:
        """The engine's exact cached count replaces the expectation (in the charge and the index)."""
        if req.prefix and req.worker:
            self.prefixes.observed(req.worker, req.cached, exact, req.block_tokens)
        if exact != req.cached:
            t = self.tenants[req.tenant]
            before = self._key_if_waiting(t)
            self.ledger.account_cached(t, req.cached, exact, req.weight, req.path)
            req.cached = exact
            self._rekey_if_lower(t, before)

    def _release(self, req: Request) -> None:
        slot = self.workers.get(req.worker or "")
        if slot is None:
            return
        slot.committed -= req.need
        slot.expected -= req.footprint
        slot.in_flight -= 1
        slot.hold_adapter(req.adapter, -1)
        if not req.started:
            slot.pending_count -= 1
            slot.pending_tokens -= req.need
            slot.beyond -= req.beyond_room
            req.beyond_room = False

    def _refund_dispatch(self, t: Tenant, req: Request) -> None:
        """Undo a dispatch that produced nothing: the request was never served (the caller re-keys)."""
        n_p = req.prompt_tokens
        self.ledger.account(t, ((n_p, 0), None), ((n_p, req.charged_output), None), req.weight, req.path)
        self.ledger.account_cached(t, req.cached, 0, req.weight, req.path)
        req.cached = 0

    def _settle_prediction(self, t: Tenant, req: Request) -> None:
        """A request that ends (or is lost) short of its prediction gets the unused part back, at the
        weight it was charged at (its dispatch)."""
        if req.charged_output > req.output_tokens:
            served = (req.prompt_tokens, req.output_tokens)
            charged = ((req.prompt_tokens, req.charged_output), served)
            self.ledger.account(t, (served, served), charged, req.weight, req.path)
            req.charged_output = req.output_tokens


def cacheable(cached: int, prompt_tokens: int) -> int:
    """Cached tokens a prompt can have: the engine computes at least its last token."""
    return max(0, min(cached, prompt_tokens - 1))
