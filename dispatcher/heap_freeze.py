"""Keeping the dispatcher's long-lived objects out of Python's full garbage collections.

A full (oldest generation) collection scans every object the process tracks, and a dispatcher
attached to a large fleet holds many that live as long as the fleet does: a slot, a report stream and
its queue and tasks per worker, besides the libraries' own, so each such collection holds the event
loop for longer as the fleet grows (docs/speed.md). Once the fleet has settled after a change, the
dispatcher collects once and moves what is alive to Python's permanent generation (``gc.freeze``),
which later collections skip; the next refreeze first takes it back (``gc.unfreeze``), so a cycle
that became garbage meanwhile is still collected then, not kept.
"""

from __future__ import annotations

import gc
import math

SETTLE_S = 2.0  # the fleet's size unchanged this long: it has settled
MIN_GAP_S = 10.0  # at most one refreeze this often (each is one full collection)


class HeapFreeze:
    """When to refreeze: after the fleet changed and has settled, at most once per ``MIN_GAP_S``."""

    def __init__(self) -> None:
        self._size: int | None = None
        self._changed_at = -math.inf
        self._frozen_at = -math.inf
        self._due = False
        self.refreezes = 0

    def due(self, now: float, fleet_size: int) -> bool:
        """Whether to refreeze at ``now``, the fleet having ``fleet_size`` workers (a start counts as a
        change)."""
        if fleet_size != self._size:
            self._size, self._changed_at, self._due = fleet_size, now, True
        return self._due and now - self._changed_at >= SETTLE_S and now - self._frozen_at >= MIN_GAP_S

    def refreeze(self, now: float) -> None:
        """Collect what is garbage, then keep what is alive out of the collections to come."""
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._frozen_at, self._due = now, False
        self.refreezes += 1
