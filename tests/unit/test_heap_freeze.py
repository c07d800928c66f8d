"""When the dispatcher refreezes its heap: once the fleet has settled after a change, never more often
than the minimum gap; and a refreeze collects what was garbage and freezes what lives."""

from __future__ import annotations

import gc
import weakref

from fairgate.dispatcher.heap_freeze import MIN_GAP_S, SETTLE_S, HeapFreeze


def test_it_waits_for_the_fleet_to_settle_and_keeps_its_gap():
    heap = HeapFreeze()
    try:
        assert not heap.due(0.0, 0)  # a start is a change: not settled yet
        assert heap.due(SETTLE_S, 0)
        heap.refreeze(SETTLE_S)
        assert not heap.due(SETTLE_S + 0.5, 0)  # nothing changed since
        joined = SETTLE_S + 1.0
        assert not heap.due(joined, 8)  # workers joined: wait for them to settle
        assert not heap.due(joined + SETTLE_S, 8)  # settled, but within the gap since the last one
        assert heap.due(SETTLE_S + MIN_GAP_S, 8)
        assert heap.due(SETTLE_S + MIN_GAP_S + 5.0, 8)  # still due until it is done
    finally:
        gc.unfreeze()


def test_a_refreeze_collects_the_garbage_and_freezes_what_lives():
    class Node:
        def __init__(self) -> None:
            self.me = self  # a cycle: only a collection frees it

    heap = HeapFreeze()
    try:
        gc.unfreeze()
        kept, dropped = Node(), Node()
        gone = weakref.ref(dropped)
        del dropped
        assert gone() is not None  # its cycle keeps it until a collection
        heap.refreeze(0.0)
        assert gone() is None and kept.me is kept
        assert gc.get_freeze_count() > 0 and heap.refreezes == 1
    finally:
        gc.unfreeze()
