"""Placement by cached prefix: the worker expected to hold the longest prefix of the prompt."""

from __future__ import annotations

from collections.abc import Sequence

from fairgate.core.model import Request
from fairgate.core.placement.base import BALANCE, BALANCE_DOC, PlacementRule, fullness, most_room, register
from fairgate.core.prefix_index import PrefixIndex
from fairgate.core.registry import Param
from fairgate.core.workers import WorkerSlot

# Prefill a cached token saves, by where it is: a load from host memory or the shared store costs a
# few percent of the prefill it replaces on long prompts (workers/engines/simulated/tiers.py), and the
# nearer copy is preferred between otherwise equal workers.
HOST_SAVING = 0.9
SHARED_SAVING = 0.8


@register
class PrefixAffinity(PlacementRule):
    """The longest expected cached prefix (``PrefixIndex``) among the workers that can start the
    request and are at most ``BALANCE`` of their pool fuller than the emptiest one; then the most
    room. A request with no known prefix, or one no worker holds, goes where ``most-room`` puts it.

    The balance limit keeps one worker from taking a whole popular prefix's traffic while the
    others idle: past it, recomputing the prefix elsewhere is cheaper than queueing behind it.

    Where engines report cache tiers below their pools, a worker's expectation is the prefill it
    saves: pool hits in full, host-memory and shared-store hits at ``HOST_SAVING`` and
    ``SHARED_SAVING`` (their loads cost a little).
    """

    name = "prefix-affinity"
    params = (Param("balance", float, BALANCE, BALANCE_DOC),)

    def __init__(self, balance: float = BALANCE) -> None:
        if not 0.0 <= balance <= 1.0:
            raise ValueError(f"placement prefix-affinity: balance must be in [0, 1], got {balance}")
        self.balance = balance
        self._prefixes = PrefixIndex()

    def attach(self, prefixes: PrefixIndex) -> None:
        self._prefixes = prefixes

    def choose(self, fits: Sequence[WorkerSlot], request: Request | None) -> WorkerSlot:
        if request is None or not request.prefix:
            return min(fits, key=most_room)
        emptiest = min(fullness(w) for w in fits)
        prefixes, prefix, block = self._prefixes, request.prefix, request.block_tokens
        expected = self._saved if prefixes.tiered else prefixes.expected_tokens
        near = [w for w in fits if fullness(w) <= emptiest + self.balance]  # the emptiest is always near
        return min(near, key=lambda w: (-expected(w.id, prefix, block), *most_room(w)))

    def _saved(self, worker_id: str, prefix: Sequence[int], block: int) -> float:
        gpu, host, shared = self._prefixes.expected_by_tier(worker_id, prefix, block)
        return gpu + HOST_SAVING * host + SHARED_SAVING * shared
