"""The workers' report pace as the dispatcher sets it: fast while requests wait, merged while none has
waited a while, and reports of tokens held longer while the dispatcher's own process is busy."""

from __future__ import annotations

from fairgate.dispatcher.report_pace import IDLE_S, LOADED_MAX_S, LOADED_MIN_S, RELAX_AFTER_S, WAITING_S, ReportPace


class Process:
    """A CPU clock the test moves: ``share`` of a core used per second of the pace's clock."""

    def __init__(self) -> None:
        self.used = 0.0

    def run(self, seconds: float, share: float) -> None:
        self.used += seconds * share


def test_waiting_is_fast_and_idle_merges_after_a_while():
    cpu = Process()
    pace = ReportPace(0.0, lambda: cpu.used)
    assert not pace.update(0.01, waiting=True) and pace.report_s == WAITING_S
    assert not pace.update(0.01 + RELAX_AFTER_S / 2, waiting=False)  # not idle long enough
    assert pace.update(0.02 + RELAX_AFTER_S, waiting=False) and pace.report_s == IDLE_S
    assert pace.update(0.2, waiting=True) and pace.report_s == WAITING_S


def test_a_busy_dispatcher_holds_token_reports_longer_and_lets_go_once_easy():
    cpu = Process()
    pace = ReportPace(0.0, lambda: cpu.used)
    now, seen = 0.0, []
    for _ in range(5):  # a second at a time, 90% of a core, requests waiting
        now += 1.0
        cpu.run(1.0, 0.9)
        pace.update(now, waiting=True)
        seen.append(pace.loaded_s)
    assert seen[0] == LOADED_MIN_S and seen == sorted(seen) and seen[-1] == LOADED_MAX_S
    assert pace.report_s == LOADED_MAX_S  # tokens too, though requests wait
    cpu.run(1.0, 0.5)  # between the thresholds: it stays
    now += 1.0
    assert not pace.update(now, waiting=True)
    for _ in range(4):
        now += 1.0
        cpu.run(1.0, 0.1)
        pace.update(now, waiting=True)
    assert pace.report_s == WAITING_S and pace.loaded_s == 0.0


def test_the_load_is_read_once_a_window():
    cpu = Process()
    pace = ReportPace(0.0, lambda: cpu.used)
    cpu.run(0.5, 1.0)  # a busy half second, read before the window ends: nothing yet
    assert not pace.update(0.5, waiting=True) and pace.loaded_s == 0.0
    cpu.run(0.5, 1.0)
    assert pace.update(1.0, waiting=True) and pace.report_s == LOADED_MIN_S
