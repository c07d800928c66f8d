"""The scheduler's door to the quotas (``fairgate.core.quotas``): what a request may use at most and
what it used, priced at its pool's model; whether a quota refuses or demotes it; what it holds while it
runs; and why the requests a quota dropped at their turn were dropped, until the caller asks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairgate.core.model import Request, Tenant
from fairgate.core.quotas import Amount, Prices, QuotaBook, QuotaRule, Refusal
from fairgate.core.tenant_book import TenantBook


class QuotaGate:
    """Quotas as one pool's scheduler sees them. The book itself is shared by every pool of a
    dispatcher and saved by the dispatcher, so a snapshot of the gate holds only its own answers."""

    __slots__ = ("_book", "_dropped", "_taken", "last_refusal", "prices", "quotas")

    def __init__(self, quotas: QuotaBook, prices: Prices, book: TenantBook) -> None:
        self.quotas = quotas
        self.prices = prices  # this pool's model's, for money quotas
        self._book = book
        self.last_refusal: Refusal | None = None  # the latest refusal (its answer says when to retry)
        self._dropped: dict[str, Refusal] = {}  # requests a quota dropped at their turn, not yet taken
        self._taken: dict[str, Refusal] = {}  # those of the last take

    def __bool__(self) -> bool:
        return bool(self.quotas)

    def most(self, prompt_tokens: int, max_tokens: int) -> Amount:
        """The most a request may use: all its tokens, its prompt priced as if none of it were cached."""
        return Amount(prompt_tokens + max_tokens, self.prices.cost(prompt_tokens, 0, max_tokens))

    def used(self, prompt_tokens: int, cached: int, output_tokens: int) -> Amount:
        return Amount(prompt_tokens + output_tokens, self.prices.cost(prompt_tokens, cached, output_tokens))

    def over(self, t: Tenant, prompt_tokens: int, max_tokens: int, now: float) -> Refusal | None:
        """The quota a request of ``t`` of this size would exceed now (one that rejects before one that
        demotes), remembered as the latest refusal; None: it fits every quota."""
        book = self._book
        refusal = self.quotas.refusal(book.quota_names(t), self.most(prompt_tokens, max_tokens), now, book.quota_path)
        if refusal is not None:
            self.last_refusal = refusal
        return refusal

    def hold(self, req: Request, t: Tenant, now: float) -> None:
        """``req`` was dispatched: the most it may use is held in its quotas while it runs."""
        self.quotas.hold(req.id, self._book.quota_names(t), self.most(req.prompt_tokens, req.max_tokens), now)

    def hold_adopted(self, req: Request, t: Tenant, now: float) -> None:
        """A running request announced by its worker: its quotas learn of it now, unless they hold it."""
        if self.quotas and not self.quotas.holding(req.id):
            self.hold(req, t, now)

    def settle(self, req: Request, t: Tenant, now: float) -> None:
        """``req`` ended: what it used replaces its hold."""
        used = self.used(req.prompt_tokens, req.cached, req.output_tokens)
        self.quotas.settle(req.id, used, self._book.quota_names(t), now)

    def settle_lost(self, request_id: str, prompt_tokens: int, output_tokens: int) -> None:
        """A request lost with its worker and never announced again: its hold ends at what it used."""
        self.quotas.settle(request_id, self.used(prompt_tokens, 0, output_tokens), (), 0.0)

    def release(self, request_id: str) -> None:
        """A request that never ran (refunded): its hold goes."""
        self.quotas.release(request_id)

    def dropped(self, request_id: str, refusal: Refusal) -> None:
        """A quota dropped ``request_id`` at its turn (told with the dropped requests)."""
        self._dropped[request_id] = refusal

    def take_dropped(self) -> None:
        """The dropped requests were taken: their refusals are the ones ``dropped_refusal`` tells."""
        self._taken, self._dropped = self._dropped, {}

    def dropped_refusal(self, request_id: str) -> Refusal | None:
        return self._taken.get(request_id)

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, Any]:
        return {
            "last_refusal": None if self.last_refusal is None else _refusal_row(self.last_refusal),
            "dropped": {rid: _refusal_row(r) for rid, r in self._dropped.items()},
            "taken": {rid: _refusal_row(r) for rid, r in self._taken.items()},
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        last = data["last_refusal"]
        self.last_refusal = None if last is None else _refusal_of(last)
        self._dropped = {rid: _refusal_of(row) for rid, row in data["dropped"].items()}
        self._taken = {rid: _refusal_of(row) for rid, row in data["taken"].items()}


def _refusal_row(refusal: Refusal) -> dict[str, Any]:
    return {"rule": refusal.rule.to_dict(), "retry_after_s": refusal.retry_after_s, "left": refusal.left}


def _refusal_of(row: Mapping[str, Any]) -> Refusal:
    return Refusal(QuotaRule.from_dict(row["rule"]), float(row["retry_after_s"]), str(row["left"]))
