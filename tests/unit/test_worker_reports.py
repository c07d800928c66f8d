"""Step reports that queue up behind a busy stream go to the dispatcher as one message that says
exactly what the separate ones said."""

from __future__ import annotations

import asyncio

from fairgate.common.rpc import fairgate_pb2 as pb
from fairgate.workers.report_outbox import ReportOutbox
from fairgate.workers.worker import _CLOSED, _merge_queued


def report(started=(), tokens=(), finished=(), free=0, seconds=0.001) -> pb.WorkerMessage:
    return pb.WorkerMessage(
        report=pb.StepReport(
            started=[pb.Started(request_id=r, prompt_tokens=n, tenant="t") for r, n in started],
            new_tokens=[pb.TokenCount(request_id=r, tokens=k) for r, k in tokens],
            finished=[pb.Finished(request_id=r, output_tokens=n, reason="stop") for r, n in finished],
            free_tokens=free,
            running=len(tokens),
            step_seconds=seconds,
        )
    )


def test_queued_reports_merge_into_one_with_tokens_summed_and_the_last_pool_figures():
    outbox = ReportOutbox()
    first = report(started=[("a", 10)], tokens=[("a", 1)], free=90)
    outbox.put_nowait(report(started=[("b", 5)], tokens=[("a", 1), ("b", 1)], free=80))
    outbox.put_nowait(report(tokens=[("a", 1), ("b", 1)], finished=[("a", 3)], free=85))
    goodbye = pb.WorkerMessage(goodbye=pb.Goodbye(reason="draining"))
    outbox.put_nowait(goodbye)
    outbox.put_nowait(report(tokens=[("b", 1)], free=86))
    merged, held = _merge_queued(first, outbox)
    r = merged.report
    assert [(s.request_id, s.prompt_tokens) for s in r.started] == [("a", 10), ("b", 5)]
    assert {t.request_id: t.tokens for t in r.new_tokens} == {"a": 3, "b": 2}
    assert [(f.request_id, f.output_tokens) for f in r.finished] == [("a", 3)]
    assert (r.free_tokens, r.running) == (85, 2) and abs(r.step_seconds - 0.003) < 1e-12
    assert held is goodbye  # the goodbye goes next, in order; later reports wait
    assert outbox.get_nowait().report.free_tokens == 86 and outbox.empty()
    assert first.report.new_tokens[0].tokens == 1  # the message it started from is left as it was


def test_the_outbox_end_found_while_merging_is_kept():
    outbox = ReportOutbox()
    outbox.put_nowait(report(tokens=[("a", 1)]))
    outbox.put_nowait(None)
    merged, held = _merge_queued(report(tokens=[("a", 1)]), outbox)
    assert held is _CLOSED and merged.report.new_tokens[0].tokens == 2


def test_a_position_is_acknowledged_once_the_dispatcher_applied_what_carried_it_but_not_what_was_held():
    async def scenario():
        outbox = ReportOutbox()
        first, second = outbox.put_nowait(report()), outbox.put_nowait(report())
        assert (first, second) == (1, 2)
        waiting = asyncio.create_task(outbox.until_acked(second, 30.0))
        await outbox.get()
        outbox.get_nowait()
        carried = outbox.sending(held=1)  # the second was taken while merging and goes with the next
        assert carried == first
        outbox.acked(carried)
        await asyncio.sleep(0.01)
        assert not waiting.done()
        outbox.acked(outbox.sending())
        await asyncio.wait_for(waiting, 1.0)

    asyncio.run(scenario())


def test_nobody_waits_on_a_closed_stream_or_past_the_timeout():
    async def scenario():
        outbox = ReportOutbox()
        position = outbox.put_nowait(report())
        started = asyncio.get_running_loop().time()
        await outbox.until_acked(position, 0.05)
        assert asyncio.get_running_loop().time() - started >= 0.04
        waiting = asyncio.create_task(outbox.until_acked(position, 30.0))
        await asyncio.sleep(0.01)
        outbox.close()  # the stream broke: the next stream's hello says what ended
        await asyncio.wait_for(waiting, 1.0)

    asyncio.run(scenario())
