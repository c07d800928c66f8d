"""The pace of the workers' step reports (``Pace``), set from who waits and from the dispatcher's own load.

While requests wait, each report may decide the next choice, so reports go as fast as a worker sends
them; once none has waited for ``RELAX_AFTER_S``, a report only moves counters that decide nothing, so
workers merge their steps for up to ``IDLE_S`` (far fewer reports, and less CPU at both ends). A queue
that forms asks for the fast pace at once, and the workers send what they hold. Closed-loop clients
come in waves (a batch started together ends together), so the idle pace comes back soon after each
wave: two idle intervals, not seconds.

A large fleet's reports are most of a busy dispatcher's work (each carries every running request's
new tokens), so when the dispatcher's process uses more than ``BUSY_SHARE`` of a core over a window of
``WINDOW_S``, reports of tokens are held for longer (doubling up to ``LOADED_MAX_S``), and the pace
comes back down once it uses less than ``EASY_SHARE``. A report that says a request started or ended
still goes at once (the worker's floor): a client reading its usage right after its answer finds it
charged.
The fairness bound grows with the pace by what one report of each engine carries
(docs/architecture.md, "Additions to the bound").
"""

from __future__ import annotations

import time
from collections.abc import Callable

WAITING_S = 0.0  # as fast as a worker goes (its own floor merges sub-millisecond steps)
IDLE_S = 0.05
RELAX_AFTER_S = 0.1
WINDOW_S = 1.0  # the load is read over this
BUSY_SHARE = 0.6  # of one core: above it, the reports are held longer
EASY_SHARE = 0.3  # below it, shorter again
LOADED_MIN_S = 0.01  # the first step up from no hold
LOADED_MAX_S = 0.05


class ReportPace:
    """The interval the workers are told for reports of tokens (``report_s``)."""

    def __init__(self, now: float, cpu: Callable[[], float] = time.process_time) -> None:
        self._cpu = cpu
        self._last_waiting = now  # when a request last waited
        self._window = (now, cpu())
        self.loaded_s = 0.0  # how long every report is held for the dispatcher's load (0: not loaded)
        self.report_s = WAITING_S

    def update(self, now: float, waiting: bool) -> bool:
        """The pace after an assignment pass at ``now`` (``waiting``: requests wait); True when it changed."""
        if waiting:
            self._last_waiting = now
        start, used = self._window
        if now - start >= WINDOW_S:
            cpu = self._cpu()
            share = (cpu - used) / (now - start)
            self._window = (now, cpu)
            if share > BUSY_SHARE:
                self.loaded_s = min(LOADED_MAX_S, max(LOADED_MIN_S, 2 * self.loaded_s))
            elif share < EASY_SHARE:
                self.loaded_s = self.loaded_s / 2 if self.loaded_s / 2 >= LOADED_MIN_S else 0.0
        idle = now - self._last_waiting >= RELAX_AFTER_S
        report_s = max(IDLE_S if idle else WAITING_S, self.loaded_s)
        if report_s == self.report_s:
            return False
        self.report_s = report_s
        return True
