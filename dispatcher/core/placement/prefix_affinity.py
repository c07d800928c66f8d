"""Placement by cached prefix: the worker expected to hold the longest prefix of the prompt."""

from __future__ import annotations

from collections.abc import Sequence

from dispatcher.core.model import Request
from dispatcher.core.placement.base import PlacementRule, fullness, most_room, register
from dispatcher.core.prefix_index import PrefixIndex
from dispatcher.core.workers import WorkerSlot

BALANCE = 0.25  # a worker more than this much fuller (fraction of its pool) than the emptiest is passed over


@register
class PrefixAffinity(PlacementRule):
    """The longest expected cached prefix (``PrefixIndex``) among the workers that can start the
    request and are at most ``BALANCE`` of their pool fuller than the emptiest one; then the most
    room. A request with no known prefix, or one no worker holds, goes where ``most-room`` puts it.

    The balance limit keeps one worker from taking a whole popular prefix's traffic while the
    others idle: past it, recomputing the prefix elsewhere is cheaper than queueing behind it.
    """

    name = "prefix-affinity"

    def __init__(self) -> None:
        self._prefixes = PrefixIndex()

    def attach(self, prefixes: PrefixIndex) -> None:
        self._prefixes = prefixes

    def choose(self, fits: Sequence[WorkerSlot], request: Request | None) -> WorkerSlot:
        if request is None or not request.prefix:
            return min(fits, key=most_room)
        emptiest = min(fullness(w) for w in fits)
        expected, prefix, block = self._prefixes.expected_tokens, request.prefix, request.block_tokens
        best, best_gain = None, -1
        for w in fits:
            if fullness(w) > emptiest + BALANCE:
                continue
            gain = expected(w.id, prefix, block)
            if gain > best_gain or (gain == best_gain and most_room(w) < most_room(best)):  # type: ignore[arg-type]
                best, best_gain = w, gain
        return best  # type: ignore[return-value]  # the emptiest is always near
