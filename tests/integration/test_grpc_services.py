"""The dispatcher service and simulated workers on loopback (no Ray): the workers' real gRPC stream to the
dispatcher, the data plane's and admission's real frames on TCP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass

import pytest

from fairgate.common.frame_guard import DATA_PLANE_HOP, HandshakeRefused, hop_key
from fairgate.common.frames import ConnectionLost, FrameConnection, connect
from fairgate.common.rpc import fairgate_pb2 as pb
from fairgate.common.tickets import TicketFields, sign, ticket_message
from fairgate.core import LinearCost, SchedulerConfig
from fairgate.dispatcher.report_pace import IDLE_S as REPORT_PACE_IDLE_S
from fairgate.dispatcher.service import DispatcherService, Placement, Rejected
from fairgate.workers import worker as worker_module
from fairgate.workers.engines.simulated import SimulatedEngine, StepTimeModel
from fairgate.workers.engines.simulated.runner import SimulatedRunner
from fairgate.workers.engines.simulated.tokenizer import count_tokens
from fairgate.workers.worker import REPORT_LINGER_S, Worker

from ..waiting import eventually

SECRET = b"test-secret-not-for-production"
FAST = StepTimeModel(0.002, 0.0, 0.0, 0.0)  # every step 2 ms


async def cluster(
    n_workers: int = 1, kv_tokens: int = 4000, policy: str = "vtc", steps: StepTimeModel = FAST, engine_queue: int = 8
):
    """A dispatcher and its simulated workers; ``engine_queue``: requests that may wait inside an engine
    beyond its room (0: a request that does not fit waits in the dispatcher)."""
    service = DispatcherService(SchedulerConfig(policy=policy, max_engine_waiting=engine_queue), SECRET)
    address = await service.start()
    workers = [
        Worker(f"w{i}", address, SECRET, SimulatedRunner(SimulatedEngine(kv_tokens, steps))) for i in range(n_workers)
    ]
    for w in workers:
        await w.start()
    await eventually(lambda: len(service.scheduler.workers) == n_workers)
    assert len(service.scheduler.workers) == n_workers
    return service, workers


async def shutdown(service, workers):
    for w in workers:
        await w.stop()
    await service.stop()


def completion_request(
    ticket: pb.Ticket, prompt: str, max_tokens: int, ignore_eos: bool = True, prompt_tokens: int = 0
):
    """Worker.Generate for a streamed text completion, as the ingress sends it: the raw body."""
    body = {"model": "sim", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": ignore_eos, "stream": True}
    return pb.GenerateRequest(
        ticket=ticket,
        endpoint="completions",
        body=json.dumps(body).encode(),
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        choices=1,
    )


class Refused(Exception):
    """The worker answered with a ``Refusal`` instead of serving the request."""

    def __init__(self, refusal: pb.Refusal) -> None:
        super().__init__(f"{refusal.code}: {refusal.detail}")
        self.code, self.detail, self.retryable = refusal.code, refusal.detail, refusal.retryable


async def send_generate(address: str, request: pb.GenerateRequest) -> list[pb.GenerateChunk]:
    """One request on a fresh data-plane connection, read to its last chunk."""
    conn = await connect(address, FrameConnection, hop_key(SECRET, DATA_PLANE_HOP))
    try:
        conn.send(request.SerializeToString())
        chunks = []
        while True:
            chunk = pb.GenerateChunk.FromString(await conn.next_frame())
            if chunk.HasField("refusal"):
                raise Refused(chunk.refusal)
            chunks.append(chunk)
            if chunk.finish_reason:
                return chunks
    finally:
        conn.abort()


async def generate(placement: Placement, prompt: str, max_tokens: int, ignore_eos: bool = True):
    request = completion_request(placement.ticket_message(), prompt, max_tokens, ignore_eos)
    return await send_generate(placement.address, request)


def text_of(data: bytes | list[bytes]) -> str:
    """The text of a streamed completion's server-sent events."""
    raw = b"".join(data) if isinstance(data, list) else data
    events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    return "".join(json.loads(e)["choices"][0]["text"] for e in events if e != "[DONE]" and json.loads(e)["choices"])


def test_submit_assign_generate_and_account_exactly():
    async def scenario():
        service, workers = await cluster()
        prompt = "Tell me, in exactly eleven tokens: why is the sky blue ?"
        n_prompt = count_tokens(prompt)
        placement = await service.submit("r1", "alice", n_prompt, 12)
        assert placement.worker_id == "w0" and placement.address == workers[0].address
        chunks = await generate(placement, prompt, 12)
        assert chunks[-1].finish_reason == "length"
        assert chunks[-1].completion_tokens == 12 and chunks[-1].prompt_tokens == n_prompt
        assert chunks[0].status == 200 and chunks[0].content_type.startswith("text/event-stream")
        assert count_tokens(text_of([c.data for c in chunks])) == 12
        # the finish report may trail the last chunk by a step
        await eventually(lambda: not service.scheduler.in_flight())
        stats = service.stats()
        assert stats["tenants"]["alice"]["service"] == LinearCost().total(n_prompt, 12)
        assert stats["in_flight"] == 0 and stats["workers"][0]["committed"] == 0
        sample, full = service.sample(), service.telemetry()  # the per-second sample: no worker rows
        assert "workers" not in sample and sample["tenants"] == full["tenants"]
        for key in ("queue_depth", "backlog_tokens", "gap", "two_u", "dispatched", "nodes"):
            assert sample[key] == full[key], key
        await shutdown(service, workers)

    asyncio.run(scenario())


@pytest.mark.parametrize("tamper", ["signature", "worker", "expired"])
def test_worker_refuses_generate_without_a_valid_ticket(tamper):
    async def scenario():
        service, workers = await cluster()
        w = workers[0]
        fields = TicketFields("forged", "mallory", "w0", time.time() + 30, 10, 5)
        signature = sign(SECRET, fields)
        if tamper == "signature":
            signature = sign(b"some other secret", fields)
        elif tamper == "worker":
            fields = TicketFields("forged", "mallory", "w9", fields.expires_at, 10, 5)
            signature = sign(SECRET, fields)
        else:
            fields = TicketFields("forged", "mallory", "w0", time.time() - 1, 10, 5)
            signature = sign(SECRET, fields)
        forged = Placement("forged", "w0", w.address, fields, signature)
        with pytest.raises(Refused) as err:
            await generate(forged, "hello", 5)
        assert err.value.code == "permission_denied" and err.value.retryable
        assert not w.runner.has_work()
        await shutdown(service, workers)

    asyncio.run(scenario())


def test_queued_submit_waits_for_capacity_and_cancel_withdraws_it():
    async def scenario():
        service, workers = await cluster(kv_tokens=100, engine_queue=0)
        first = await service.submit("a", "A", 50, 40)  # its prompt holds 51 of 100 once it starts
        waiting = asyncio.create_task(service.submit("b", "B", 50, 40))
        await asyncio.sleep(0.05)
        assert not waiting.done() and service.scheduler.is_backlogged("B")
        waiting.cancel()
        await asyncio.sleep(0.01)
        assert not service.scheduler.is_backlogged("B") and service.scheduler.queue_depth() == 0
        third = asyncio.create_task(service.submit("c", "C", 50, 40))
        await generate(first, "x " * 50, 40)  # "a" finishes: "c" gets its place
        placement = await asyncio.wait_for(third, 5)
        assert placement.request_id == "c"
        await shutdown(service, workers)

    asyncio.run(scenario())


def test_reports_are_held_while_nothing_waits_and_go_at_once_when_a_request_queues():
    """The dispatcher's pace: a worker starts sending each step's report; once nothing has waited for a
    while it merges its steps (far fewer reports); a request that queues brings the fast pace back at
    once, and the finish that makes room for it is not held."""

    async def scenario():
        service, workers = await cluster(kv_tokens=300, steps=StepTimeModel(0.01, 0.0, 0.0, 0.0), engine_queue=0)
        w = workers[0]
        assert w._report_linger == REPORT_LINGER_S
        reports: list[float] = []
        apply = service._apply

        def counted(worker_id, msg):
            if msg.WhichOneof("kind") == "report":
                reports.append(time.monotonic())
            return apply(worker_id, msg)

        service._apply = counted
        first = await service.submit("a", "A", 10, 250)  # 10 ms steps: 2.5 s of reports
        running = asyncio.create_task(generate(first, "x " * 10, 250))
        await eventually(lambda: w._report_linger == REPORT_PACE_IDLE_S)
        assert w._report_linger == REPORT_PACE_IDLE_S, "nothing waited, yet the dispatcher kept the fast pace"
        since = len(reports)
        await asyncio.sleep(0.5)  # about 50 steps
        assert len(reports) - since <= 15, f"{len(reports) - since} reports in 0.5 s at the idle pace"
        waiting = asyncio.create_task(service.submit("b", "B", 290, 5))  # 291 > 300 less a's 11+: it waits
        await eventually(lambda: w._report_linger == REPORT_LINGER_S)
        assert w._report_linger == REPORT_LINGER_S, "a request waits, yet the worker kept holding its reports"
        await running
        placement = await asyncio.wait_for(waiting, 5)
        assert placement.request_id == "b"
        await shutdown(service, workers)

    asyncio.run(scenario())


def test_too_large_request_is_rejected():
    async def scenario():
        service, workers = await cluster(kv_tokens=100)
        with pytest.raises(Rejected, match="too_large"):
            await service.submit("big", "A", 90, 20)
        await shutdown(service, workers)

    asyncio.run(scenario())


async def flood(policy: str, seconds: float) -> tuple[float, float, bool]:
    """Closed-loop clients, twice as many for B as for A, far more than the worker holds (it admits by
    its free KV, about 40 of these beside its short queue): both tenants stay backlogged. Returns each
    tenant's service between two moments and whether both were backlogged at both moments."""
    kv = 2000
    service, workers = await cluster(kv_tokens=kv, policy=policy)
    counter = iter(range(1_000_000))

    async def client(tenant: str):
        while True:
            p = await service.submit(f"{tenant}{next(counter)}", tenant, 50, 50)
            await generate(p, "word " * 50, 50)

    # interleaved, two of B's for each of A's: the first wave queues in the same 1:2 as the rest (A's
    # fifty first would make a slow machine's window FCFS's serving of that wave alone)
    tasks = [asyncio.create_task(client(t)) for _ in range(50) for t in "BAB"]
    await asyncio.sleep(0.5)
    s = service.scheduler
    backlogged = s.is_backlogged("A") and s.is_backlogged("B")
    start = {t: s.tenants[t].service for t in "AB"}
    await asyncio.sleep(seconds)
    backlogged = backlogged and s.is_backlogged("A") and s.is_backlogged("B")
    got = [s.tenants[t].service - start[t] for t in "AB"]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await shutdown(service, workers)
    return got[0], got[1], backlogged


def test_vtc_over_grpc_keeps_two_flooding_tenants_within_2u():
    a, b, backlogged = asyncio.run(flood("vtc", 2.0))
    assert backlogged
    assert a > 0 and abs(a - b) <= 2 * max(50, 2 * 2000)


def test_fcfs_over_grpc_gives_the_heavier_sender_more():
    a, b, backlogged = asyncio.run(flood("fcfs", 2.0))
    assert backlogged
    assert b > 1.4 * a


def test_draining_worker_gets_no_new_work_and_finishes_what_it_runs():
    async def scenario():
        service, workers = await cluster(n_workers=2, kv_tokens=1000, engine_queue=0)
        running = await service.submit("r0", "A", 10, 30)
        drained = workers[int(running.worker_id[1])]
        job = asyncio.create_task(generate(running, "hi " * 10, 30))
        await asyncio.sleep(0.01)
        service.drain(running.worker_id)
        placements = [await service.submit(f"n{i}", "A", 10, 5) for i in range(5)]
        assert all(p.worker_id != running.worker_id for p in placements)
        chunks = await asyncio.wait_for(job, 5)
        assert chunks[-1].completion_tokens == 30 and chunks[-1].finish_reason == "length"
        await eventually(lambda: drained.worker_id not in service.scheduler.workers.slots)
        assert drained.worker_id not in service.scheduler.workers.slots
        await shutdown(service, workers)

    asyncio.run(scenario())


def test_an_assignment_never_used_is_freed_when_its_ticket_expires():
    async def scenario():
        ttl = 0.3
        service = DispatcherService(SchedulerConfig(max_engine_waiting=0), SECRET, ticket_ttl_s=ttl)
        address = await service.start()
        worker = Worker("w0", address, SECRET, SimulatedRunner(SimulatedEngine(100, FAST)))
        await worker.start()
        while not len(service.scheduler.workers):
            await asyncio.sleep(0.01)
        await service.submit("ghost", "A", 50, 40)  # assigned, but its caller never calls Generate
        start = time.monotonic()
        placement = await asyncio.wait_for(service.submit("next", "B", 50, 40), 5.0)  # no room beside it
        assert placement.request_id == "next"
        assert time.monotonic() - start >= ttl - 0.05  # placed only once the ghost's ticket expired
        assert "ghost" not in service.scheduler.in_flight()
        assert service.scheduler.tenants["A"].service == 0  # refunded: it was never served
        await worker.stop()
        await service.stop()

    asyncio.run(scenario())


def test_a_request_that_reached_its_engine_runs_though_its_ticket_expires_before_it_starts(monkeypatch):
    """Its worker said it arrived: the ticket's expiry leaves it to its engine (found in a suite run: a
    request held in vLLM's queue for 30 s was aborted by the expiry and answered with nothing). Here the
    engine is in the middle of a long step when it arrives, and starts it only at the next one."""

    monkeypatch.setattr(worker_module, "ARRIVAL_REPORT_S", 0.05)

    async def scenario():
        ttl = 0.15
        service = DispatcherService(SchedulerConfig(), SECRET, ticket_ttl_s=ttl)
        address = await service.start()
        slow = StepTimeModel(0.4, 0.0, 0.0, 0.0)  # every step 0.4 s: longer than a ticket
        worker = Worker("w0", address, SECRET, SimulatedRunner(SimulatedEngine(1000, slow)))
        await worker.start()
        await eventually(lambda: len(service.scheduler.workers) == 1)
        first = await service.submit("first", "A", 50, 3)
        running = asyncio.create_task(generate(first, "hi " * 50, 3))
        await asyncio.sleep(0.2)  # the ticket expired before the engine's first step ended
        placed = await asyncio.wait_for(service.submit("later", "B", 50, 3), 2.0)
        chunks = await asyncio.wait_for(generate(placed, "hi " * 50, 3), 5.0)
        for done in (await running, chunks):
            assert done[-1].completion_tokens == 3 and done[-1].finish_reason == "length"
        assert service.scheduler.tenants["A"].service > 0 and service.scheduler.tenants["B"].service > 0
        await worker.stop()
        await service.stop()

    asyncio.run(scenario())


def test_a_worker_s_word_on_a_request_assigned_elsewhere_since_does_not_count():
    """A stale copy: its caller asked again and the request now runs on another worker. The first
    worker's reports of its copy (tokens, its abort) neither charge nor end the request the second runs."""

    async def scenario():
        service, workers = await cluster(n_workers=2, kv_tokens=4000, engine_queue=0)
        placed = await service.submit("r", "A", 10, 30)
        other = next(w for w in workers if w.worker_id != placed.worker_id)
        stale = pb.StepReport(
            new_tokens=[pb.TokenCount(request_id="r", tokens=5)],
            finished=[pb.Finished(request_id="r", output_tokens=5, reason="abort")],
            free_tokens=4000,
        )
        other._outbox.put_nowait(pb.WorkerMessage(report=stale))
        await asyncio.sleep(0.3)
        req = service.scheduler.in_flight().get("r")
        assert req is not None and req.worker == placed.worker_id and req.output_tokens == 0
        chunks = await asyncio.wait_for(generate(placed, "hi " * 10, 30), 5)
        assert chunks[-1].completion_tokens == 30
        await eventually(lambda: "r" not in service.scheduler.in_flight())
        assert service.scheduler.tenants["A"].output_tokens == 30  # its own worker's tokens, once
        await shutdown(service, workers)

    asyncio.run(scenario())


def test_a_whole_answer_reaches_its_client_only_after_the_report_of_its_end_went_to_the_dispatcher(monkeypatch):
    """A worker lost right after its client got a whole answer must not leave that answer uncharged
    (found in the node-loss test: a completed request's start, tokens and end were all in a report the
    lost worker had not sent; the dispatcher took it for unstarted, placed it again, and refunded it when
    that ticket expired). Here reports linger 1.5 s: the last chunk waits for its report, not the
    dispatcher for the worker's pace."""

    monkeypatch.setattr(worker_module, "REPORT_LINGER_S", 1.5)
    monkeypatch.setattr(worker_module, "END_REPORT_WAIT_S", 30.0)

    async def scenario():
        service, workers = await cluster()
        placed = await service.submit("r", "A", 10, 5)
        chunks = await asyncio.wait_for(generate(placed, "hi " * 10, 5), 10)
        assert chunks[-1].completion_tokens == 5
        assert await eventually(lambda: "r" not in service.scheduler.in_flight(), timeout_s=0.5)
        assert service.scheduler.tenants["A"].output_tokens == 5
        await shutdown(service, workers)

    asyncio.run(scenario())


def test_a_withdraw_landing_between_assignment_and_resumption_frees_the_assignment_at_once():
    """The waiting call is assigned and cancelled in the same turn of the loop (the ingress withdrew,
    or its connection broke, as the assignment was made): the placement is freed now, not when its
    ticket expires."""

    async def scenario():
        service = DispatcherService(SchedulerConfig(max_engine_waiting=0), SECRET, ticket_ttl_s=30.0)
        address = await service.start()
        worker = Worker("w0", address, SECRET, SimulatedRunner(SimulatedEngine(100, FAST)))
        await worker.start()
        while not len(service.scheduler.workers):
            await asyncio.sleep(0.01)
        await service.submit("first", "A", 50, 40)
        waiting = asyncio.create_task(service.submit("raced", "B", 50, 40))  # no room beside the first
        while not service.scheduler.is_queued("raced"):
            await asyncio.sleep(0.01)
        service.release("first")  # its pass, at the end of this turn of the loop, assigns the waiting request ...
        await asyncio.sleep(0)  # (the pass runs; the waiting call resumes only after this one)
        assert "raced" in service.scheduler.in_flight()
        waiting.cancel()  # ... and its call is withdrawn before it resumes
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert "raced" not in service.scheduler.in_flight()
        assert service.scheduler.tenants["B"].service == 0  # refunded: it never ran
        placement = await asyncio.wait_for(service.submit("next", "C", 50, 40), 2.0)  # its room is free
        assert placement.request_id == "next"
        await worker.stop()
        await service.stop()

    asyncio.run(scenario())


def test_a_worker_stream_that_never_says_hello_is_closed(monkeypatch):
    import grpc

    from fairgate.common.rpc import fairgate_pb2_grpc as rpc
    from fairgate.dispatcher import service as service_module

    monkeypatch.setattr(service_module, "WORKER_HELLO_S", 0.3)

    async def scenario():
        service = DispatcherService(SchedulerConfig(), SECRET)
        address = await service.start()
        silence = asyncio.Event()

        async def nothing():
            await silence.wait()
            yield pb.WorkerMessage()  # never reached

        async with grpc.aio.insecure_channel(address) as channel:
            stream = rpc.DispatcherStub(channel).Connect(nothing())
            started = time.monotonic()
            replies = [m async for m in stream]
            assert replies == [] and time.monotonic() - started < 5.0  # closed by the deadline
        silence.set()
        await service.stop()

    asyncio.run(scenario())


def test_only_a_worker_holding_the_cluster_secret_can_attach():
    async def scenario():
        service = DispatcherService(SchedulerConfig(), SECRET)
        address = await service.start()
        impostor = Worker("impostor", address, b"some-other-secret", SimulatedRunner(SimulatedEngine(100, FAST)))
        await impostor.start()
        honest = Worker("honest", address, SECRET, SimulatedRunner(SimulatedEngine(100, FAST)))
        await honest.start()
        while "honest" not in service.scheduler.workers.slots:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # the impostor kept trying meanwhile
        assert list(service.scheduler.workers.slots) == ["honest"]
        placements = [await service.submit(f"r{i}", "A", 10, 5) for i in range(3)]
        assert {p.worker_id for p in placements} == {"honest"}
        await impostor.stop()
        await honest.stop()
        await service.stop()

    asyncio.run(scenario())


def test_a_request_whose_worker_died_before_starting_it_is_placed_again_once():
    """The worker dies (its stream to the dispatcher breaks) after the request was assigned to it but
    before it started: the caller asks again with the same id and gets a placement elsewhere; the tenant
    is charged once."""

    async def scenario():
        service, workers = await cluster(n_workers=1, kv_tokens=4000, engine_queue=0)
        first = await service.submit("r1", "A", 50, 10)
        assert first.worker_id == "w0"
        await workers[0].stop()  # gone without a goodbye
        while "w0" in service.scheduler.workers.slots:
            await asyncio.sleep(0.01)
        assert service.stats()["orphans"] == 1 and service.scheduler.tenants["A"].service == 0
        spare = Worker("w1", service.address, SECRET, SimulatedRunner(SimulatedEngine(4000, FAST)))
        await spare.start()
        again = await asyncio.wait_for(service.submit("r1", "A", 50, 10, retry=True), 5.0)
        assert again.worker_id == "w1" and again.request_id == "r1"
        chunks = await generate(again, "x " * 50, 10)
        assert chunks[-1].completion_tokens == 10
        while service.scheduler.in_flight():
            await asyncio.sleep(0.01)
        assert service.scheduler.tenants["A"].service == 50 + 2 * 10  # one prefill, ten tokens
        assert service.stats()["orphans"] == 0 and spare.generated == {"r1": 1}
        await shutdown(service, [spare])

    asyncio.run(scenario())


def test_a_retry_for_a_request_that_started_on_a_dead_worker_is_refused():
    async def scenario():
        service, workers = await cluster(n_workers=2)
        # long enough (3,000 steps of 2 ms) to outlast the worker's 0.5 s grace when it stops
        placement = await service.submit("r1", "A", 10, 3000)
        stream = asyncio.create_task(generate(placement, "x " * 10, 3000))
        while not service.scheduler.in_flight()["r1"].started:
            await asyncio.sleep(0.01)
        victim = next(w for w in workers if w.worker_id == placement.worker_id)
        await victim.stop()
        with pytest.raises(ConnectionLost):
            await stream
        while victim.worker_id in service.scheduler.workers.slots:
            await asyncio.sleep(0.01)
        with pytest.raises(Rejected, match="worker_lost"):
            await service.submit("r1", "A", 10, 3000, retry=True)
        assert not service.scheduler.in_flight() and service.scheduler.queue_depth() == 0
        await shutdown(service, [w for w in workers if w is not victim])

    asyncio.run(scenario())


@dataclass
class Restart:
    """A dispatcher, the one that takes over from it, and a worker attached to the first that follows
    ``where`` to whichever is current."""

    old: DispatcherService
    new: DispatcherService
    new_address: str
    where: dict[str, str]
    worker: Worker


async def restartable(steps: StepTimeModel) -> Restart:
    old = DispatcherService(SchedulerConfig(cost=LinearCost(1.0, 2.0)), SECRET)
    new = DispatcherService(SchedulerConfig(cost=LinearCost(1.0, 2.0)), SECRET)
    old_address, new_address = await old.start(), await new.start()
    where = {"address": old_address}

    async def locate() -> str:
        return where["address"]

    worker = Worker("w0", locate, SECRET, SimulatedRunner(SimulatedEngine(4000, steps)))
    await worker.start()
    while not len(old.scheduler.workers):
        await asyncio.sleep(0.01)
    return Restart(old, new, new_address, where, worker)


def test_a_worker_re_attaching_to_a_restarted_dispatcher_re_announces_what_it_runs():
    """A new dispatcher (same secret, counters restored) learns the running request from the worker's
    hello and charges only the tokens generated after the saved state."""

    async def scenario():
        r = await restartable(StepTimeModel(0.01, 0, 0, 0))
        old, new, new_address, where, worker = r.old, r.new, r.new_address, r.where, r.worker
        placement = await old.submit("r1", "A", 20, 100)
        stream = asyncio.create_task(generate(placement, "x " * 20, 100))
        while old.scheduler.tenants["A"].output_tokens < 10:
            await asyncio.sleep(0.01)
        saved = old.scheduler.durable_state()
        new.scheduler.restore_durable(saved)
        where["address"] = new_address
        await old.stop()  # the old dispatcher dies; the stream to the client goes on untouched
        chunks = await stream
        assert chunks[-1].completion_tokens == 100
        while new.scheduler.in_flight():
            await asyncio.sleep(0.01)
        a = new.scheduler.tenants["A"]
        assert a.output_tokens == 100 and a.service == 20 + 2 * 100  # exact across the restart
        await worker.stop()
        await new.stop()

    asyncio.run(scenario())


def test_requests_assigned_and_ended_between_the_last_save_and_a_restart_are_counted_once():
    """The dispatcher saves its state, assigns and finishes more requests, then dies. The one that
    takes over from the saved state learns those requests from the worker's hello (their tickets say
    they were assigned after the save) and counts them, exactly once, whatever hellos follow."""

    async def scenario():
        r = await restartable(FAST)
        old, new, new_address, where, worker = r.old, r.new, r.new_address, r.where, r.worker

        async def run(rid: str) -> None:
            placement = await old.submit(rid, "A", 10, 20)
            await generate(placement, "x " * 10, 20)
            while rid in old.scheduler.in_flight():
                await asyncio.sleep(0.005)

        await run("before")
        saved = old.durable_state()
        for i in range(5):  # assigned and ended after the save: in no saved counter
            await run(f"after{i}")
        total = old.scheduler.tenants["A"].service
        assert total == 6 * (10 + 2 * 20)
        new.restore(saved)
        where["address"] = new_address
        await old.stop()
        while "w0" not in new.scheduler.workers.slots:
            await asyncio.sleep(0.01)
        assert new.scheduler.tenants["A"].service == total
        await new.stop()  # the stream breaks again: the next hello re-announces the same requests
        again = await new.start()
        where["address"] = again
        while "w0" not in new.scheduler.workers.slots:
            await asyncio.sleep(0.01)
        assert new.scheduler.tenants["A"].service == total  # never twice
        await worker.stop()
        await new.stop()

    asyncio.run(scenario())


def test_a_prefill_under_way_when_its_client_leaves_is_charged_even_if_the_release_comes_first():
    """The client leaves while the engine prefills its request; the ingress releases the request at the
    dispatcher before the worker's report says it started (the ingress's path: its data-plane stream
    closed, then ``release``). The engine did the prefill: the tenant pays for it, as it pays for any
    prompt the engine took in, and the engine stops it at once. (Before, the worker's report named no
    tenant for a request its caller had left, so the dispatcher, which had refunded it, could not charge
    it: a free prefill; and a caller leaving before the first output did not abort it in the engine.)"""
    from fairgate.ingress.generation import Outcome, WorkerConnections, stream_bytes

    async def scenario():
        slow_steps = StepTimeModel(0.3, 0.0, 0.0, 0.0)  # a step (the prefill) takes 300 ms
        service, workers = await cluster(steps=slow_steps)
        engine = workers[0].runner.engine
        connections = WorkerConnections(SECRET)
        prompt = "x " * 200
        n_prompt = count_tokens(prompt)
        placement = await service.submit("left", "A", n_prompt, 50)
        request = completion_request(placement.ticket_message(), prompt, 50, prompt_tokens=n_prompt)
        data = stream_bytes(connections, placement.address, request, Outcome())
        first = asyncio.create_task(anext(data))
        while not any(r.id == "left" for r in engine.running):  # the engine has taken it in: prefilling
            await asyncio.sleep(0.005)
        first.cancel()  # the client leaves before any output ...
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await data.aclose()
        service.release("left")  # ... and the ingress frees it at once, before the step's report
        assert service.scheduler.tenants["A"].service == 0  # refunded, as far as the dispatcher knew
        # the step's report (started, then ended) arrives
        await eventually(lambda: service.scheduler.tenants["A"].service and not service.scheduler.in_flight())
        a = service.scheduler.tenants["A"]
        assert a.service == n_prompt + 2 * a.output_tokens and a.output_tokens <= 1  # the prefill's step only
        assert not service.scheduler.in_flight() and not engine.has_work()  # aborted in the engine at once
        await shutdown(service, workers)

    asyncio.run(scenario())


def test_a_ticket_serves_once_and_no_more_than_it_admitted():
    async def scenario():
        service, workers = await cluster()
        placement = await service.submit("r1", "alice", 3, 5)
        with pytest.raises(Refused) as err:  # more than was admitted (and charged for)
            await generate(placement, "one two three", 500)
        assert err.value.code == "permission_denied" and "admitted" in err.value.detail
        chunks = await generate(placement, "one two three", 5)
        assert chunks[-1].finish_reason == "length"
        with pytest.raises(Refused) as err:  # the same ticket again
            await generate(placement, "one two three", 5)
        assert err.value.code == "permission_denied" and "used" in err.value.detail
        assert workers[0].generated["r1"] == 1
        await shutdown(service, workers)

    asyncio.run(scenario())


def test_a_released_assignment_frees_its_reservation_at_once():
    """The ingress gives up on an assignment before its worker started it (it failed on the way, or
    the client left): the next tenant's request is placed now, not when the ticket expires."""

    async def scenario():
        service, workers = await cluster(kv_tokens=100, engine_queue=0)
        await service.submit("big", "mallory", 90, 10)  # its prompt takes 91 of the pool's 100
        waiting = asyncio.ensure_future(service.submit("next", "alice", 10, 50))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        service.release("big")
        placement = await asyncio.wait_for(waiting, 5)
        assert placement.request_id == "next"
        stats = service.stats()["tenants"]
        assert stats["mallory"]["in_flight"] == 0 and stats["mallory"]["counter"] == 0  # refunded
        assert service.scheduler.workers["w0"].committed == 11  # its prompt and first token: nothing for output
        await shutdown(service, workers)

    asyncio.run(scenario())


def test_one_request_failing_on_a_worker_never_ends_another_stream_and_connections_are_reused_clean():
    """The ingress reuses its connections to a worker: a request refused by the worker (a bad ticket)
    or ended by its client leaves every other request streaming; a connection goes back for the next
    request only after a clean end (a refusal is one), never after its client left."""
    from fairgate.ingress.generation import Outcome, WorkerConnections, WorkerLost, stream_bytes

    async def scenario():
        service, workers = await cluster()
        connections = WorkerConnections(SECRET)
        long = await service.submit("long", "alice", 3, 200)
        outcome = Outcome()
        request = completion_request(long.ticket_message(), "one two three", 200, prompt_tokens=3)
        stream = stream_bytes(connections, long.address, request, outcome)
        pieces = [await anext(stream)]
        for tamper in ("signature", "too large"):
            bad = await service.submit(f"bad-{tamper}", "mallory", 3, 5)
            ticket = bad.ticket_message()
            if tamper == "signature":
                ticket.signature = b"x" * 32
            bad_request = completion_request(ticket, "hi", 5 if tamper == "signature" else 50)
            failing = stream_bytes(connections, bad.address, bad_request, Outcome())
            with pytest.raises(WorkerLost) as err:
                await anext(failing)
            assert workers[0].address not in str(err.value) and "permission" not in str(err.value)
            assert err.value.retryable and "permission_denied" in err.value.detail
            service.release(bad.request_id)
        assert len(connections._idle[long.address]) == 1  # the refused requests' connection, reused
        quitter = await service.submit("quitter", "bob", 3, 200)
        q = completion_request(quitter.ticket_message(), "a b c", 200, ignore_eos=False, prompt_tokens=3)
        leaving = stream_bytes(connections, quitter.address, q, Outcome())
        await anext(leaving)
        await leaving.aclose()  # its client left: its connection is closed, the worker aborts it
        assert len(connections._idle[long.address]) == 0
        pieces += [piece async for piece in stream]
        assert outcome.finish_reason == "length" and outcome.completion_tokens == 200
        assert count_tokens(text_of(pieces)) == 200
        assert len(connections._idle[long.address]) == 1  # the long request ended cleanly
        await eventually(lambda: "quitter" not in workers[0]._running)
        assert "quitter" not in workers[0]._running and not workers[0].runner.has_work()
        await connections.close()
        await shutdown(service, workers)

    asyncio.run(scenario())


def test_a_worker_whose_stream_is_cut_while_it_lives_runs_nothing_twice_and_counts_capacity_once():
    """The worker's stream to the dispatcher breaks (as a network cut would) while the worker and its
    requests live on: requests assigned before the cut still run there, once, and are adopted when the
    worker re-attaches; its capacity is counted once; every charge is exact."""

    async def scenario():
        service, workers = await cluster(n_workers=1, kv_tokens=2000)
        worker = workers[0]
        prompt, max_tokens = "one two three", 30
        n_prompt = count_tokens(prompt)
        stop, done = asyncio.Event(), []

        async def client(tenant: str, i: int) -> None:
            n = 0
            while not stop.is_set():
                rid = f"{tenant}-{i}-{n}"
                n += 1
                placement = await service.submit(rid, tenant, n_prompt, max_tokens)
                chunks = await generate(placement, prompt, max_tokens)
                done.append((tenant, rid, chunks[-1].completion_tokens, chunks[-1].finish_reason))

        tasks = [asyncio.create_task(client(t, i)) for t in ("alice", "bob") for i in range(4)]
        await asyncio.sleep(0.5)
        old = service._links["w0"]
        old.outbox.put_nowait(None)  # the dispatcher's side of the stream ends
        while service._links.get("w0") in (None, old):
            await asyncio.sleep(0.005)
        checks = 0
        for _ in range(50):  # while it serves again: what is committed on it is what runs there, once
            await asyncio.sleep(0.01)
            slot = service.scheduler.workers.get("w0")
            mine = [r for r in service.scheduler.in_flight().values() if r.worker == "w0"]
            assert slot is not None and slot.committed == sum(r.need for r in mine) <= slot.kv_tokens
            checks += 1
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*tasks)
        await eventually(lambda: not service.scheduler.in_flight() and not service._pending)
        assert checks == 50 and len(done) > 16
        assert all(tokens == 30 and reason == "length" for _, _, tokens, reason in done)
        assert all(worker.generated[rid] == 1 for _, rid, _, _ in done)  # none ran twice
        s = service.scheduler
        assert not s.in_flight() and s.queue_depth() == 0 and not service._pending and not service._orphans
        assert s.workers["w0"].committed == 0 and s.workers["w0"].pending_count == 0
        for tenant in ("alice", "bob"):  # charged exactly once for each request, across the cut (a request
            # that ended while the stream was down is settled from the worker's hello)
            served = sum(1 for t, *_ in done if t == tenant)
            assert s.tenants[tenant].service == pytest.approx(served * (n_prompt + 2 * max_tokens))
        await shutdown(service, workers)

    asyncio.run(scenario())


def test_a_body_asking_more_than_its_ticket_gets_what_was_admitted():
    """The body travels as the client wrote it: whatever it says of max_tokens, the request id or the
    cache salt, the worker serves the admitted size under the gateway's id."""

    async def scenario():
        service, workers = await cluster()
        placement = await service.submit("r-admitted", "alice", 3, 5)
        body = {
            "model": "sim",
            "prompt": "one two three",
            "max_tokens": 500,
            "ignore_eos": True,
            "request_id": "chosen-by-client",
            "cache_salt": "someone-elses",
        }
        request = pb.GenerateRequest(
            ticket=placement.ticket_message(),
            endpoint="completions",
            body=json.dumps(body).encode(),
            prompt_tokens=3,
            max_tokens=5,
            choices=1,
        )
        chunks = await send_generate(placement.address, request)
        answer = json.loads(b"".join(c.data for c in chunks))
        assert answer["usage"]["completion_tokens"] == 5 and answer["choices"][0]["finish_reason"] == "length"
        assert answer["id"] == "r-admitted" and "chosen-by-client" not in workers[0].generated
        await eventually(lambda: not service.scheduler.in_flight())
        assert service.stats()["tenants"]["alice"]["output_tokens"] == 5
        refused = await service.submit("r-refused", "alice", 3, 5)  # a body the engine's layer refuses
        bad = pb.GenerateRequest(
            ticket=refused.ticket_message(),
            endpoint="completions",
            body=json.dumps({"model": "sim", "prompt": "hi", "max_tokens": 5, "temperature": 9}).encode(),
            prompt_tokens=3,
            max_tokens=5,
            choices=1,
        )
        chunks = await send_generate(refused.address, bad)
        assert chunks[0].status == 400 and json.loads(b"".join(c.data for c in chunks))["error"]["param"]
        # never reached the engine: freed and refunded at once
        await eventually(lambda: not service.scheduler.in_flight())
        assert not service.scheduler.in_flight() and service.scheduler.workers["w0"].committed == 0
        await shutdown(service, workers)

    asyncio.run(scenario())


# ----------------------------------------------------------------------------- Admission (ingress -> dispatcher)


class _Submits:
    """Stands in for the actor's ``admit``: records each request as the dispatcher reads it
    (``submit_args``); ``block`` holds calls until set."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.cancelled: list[str] = []
        self.block = asyncio.Event()
        self.block.set()

    async def __call__(self, request: pb.SubmitRequest) -> pb.SubmitReply:
        from fairgate.dispatcher.admission_service import submit_args

        rid, tenant, prompt, max_tokens, *_, tier = args = submit_args(request)
        self.calls.append(args)
        try:
            await self.block.wait()
        except asyncio.CancelledError:
            self.cancelled.append(rid)
            raise
        if tenant == "nobody":
            return pb.SubmitReply(rejected="unknown_key")
        fields = TicketFields(rid, tenant, "w0", time.time() + 30, prompt, max_tokens, "grp")
        return pb.SubmitReply(
            counter=12.5,
            service_tier=tier or "default",
            worker_id="w0",
            address="127.0.0.1:1",
            ticket=ticket_message(fields, sign(SECRET, fields)),
        )


def test_admission_takes_only_the_ingress_token_and_carries_the_whole_placement():
    asyncio.run(_admission_token_and_placement())


async def _admission_token_and_placement():
    from fairgate.dispatcher.admission_service import AdmissionServer
    from fairgate.ingress.admission_client import AdmissionClient, AdmissionRefused

    submits = _Submits()
    server = AdmissionServer(submits, SECRET, 1 << 20)
    address = await server.start("127.0.0.1")

    async def where() -> str:
        return address

    client = AdmissionClient(where, SECRET.decode(), wait_s=5.0, abandoned=lambda r: None)
    try:
        request = pb.SubmitRequest(request_id="r1", tenant="alice", prompt_tokens=7, max_tokens=9, key_hash="h")
        request.prefix.extend([3, 2**62])
        reply = await client.submit(request)
        assert reply.worker_id == "w0" and reply.counter == 12.5 and reply.service_tier == "default"
        assert reply.ticket.request_id == "r1" and reply.ticket.cache_group == "grp"
        signed = TicketFields("r1", "alice", "w0", reply.ticket.expires_at, 7, 9, "grp")
        assert reply.ticket.signature == sign(SECRET, signed)
        assert submits.calls[0] == ("r1", "alice", 7, 9, False, "h", None, (3, 2**62), 0, None, "")  # default tier
        await client.submit(pb.SubmitRequest(request_id="r2", tenant="alice", tier="", adapter="acme/support"))
        assert submits.calls[1][-2:] == ("", "acme/support")  # an empty tier is the client's, not absent
        assert (await client.submit(pb.SubmitRequest(request_id="r3", tenant="nobody"))).rejected == "unknown_key"

        submit = pb.AdmissionFrame(submit=pb.SubmitRequest(request_id="x", tenant="alice"))
        stranger = await connect(address, FrameConnection, hop_key(b"another gateway's secret", "admission"))
        stranger.send(submit.SerializeToString())  # sent after its hello: never read
        with pytest.raises(HandshakeRefused):  # a tenant reaching the port has no key
            await stranger.next_frame()
        impostor = AdmissionClient(where, "another gateway's secret", wait_s=5.0, abandoned=lambda r: None)
        with pytest.raises(AdmissionRefused):  # a deployment fault, not a client's: no retry
            await impostor.submit(pb.SubmitRequest(request_id="y", tenant="alice"))
        assert [c[0] for c in submits.calls] == ["r1", "r2", "r3"]
    finally:
        await server.stop()


def test_admission_withdraws_on_cancel_and_asks_again_after_a_restart():
    asyncio.run(_admission_cancel_and_restart())


async def _admission_cancel_and_restart():
    from fairgate.dispatcher.admission_service import AdmissionServer
    from fairgate.ingress.admission_client import AdmissionClient, DispatcherUnavailable

    submits = _Submits()
    server = AdmissionServer(submits, SECRET, 1 << 20)
    addresses = [await server.start("127.0.0.1")]

    async def where() -> str:
        return addresses[-1]

    client = AdmissionClient(where, SECRET.decode(), wait_s=10.0, abandoned=lambda r: None)
    submits.block.clear()
    queued = asyncio.create_task(client.submit(pb.SubmitRequest(request_id="gone", tenant="alice")))
    while not submits.calls:
        await asyncio.sleep(0.01)
    queued.cancel()  # the client left while queued
    await eventually(lambda: submits.cancelled)
    assert submits.cancelled == ["gone"]

    waiting = asyncio.create_task(client.submit(pb.SubmitRequest(request_id="r1", tenant="alice")))
    while len(submits.calls) < 2:
        await asyncio.sleep(0.01)
    await server.stop()  # the dispatcher restarts on another port
    submits.block.set()
    restarted = AdmissionServer(submits, SECRET, 1 << 20)
    addresses.append(await restarted.start("127.0.0.1"))
    try:
        reply = await asyncio.wait_for(waiting, 10.0)
        assert reply.ticket.request_id == "r1"
        assert submits.calls[-1][0] == "r1" and submits.calls[-1][4] is True  # asked again as a retry
    finally:
        await restarted.stop()
    gone = AdmissionClient(where, SECRET.decode(), wait_s=0.3, abandoned=lambda r: None)
    with pytest.raises(DispatcherUnavailable):  # no dispatcher comes back: the caller answers 503
        await gone.submit(pb.SubmitRequest(request_id="r2", tenant="alice"))


def test_an_ingress_call_cancelled_as_its_placement_arrives_frees_the_placement():
    asyncio.run(_admission_reply_then_cancel())


async def _admission_reply_then_cancel():
    """The client leaves in the same turn of the loop as the placement arrives: the call never
    resumes to use it, so the client hands it back (the ingress releases it at the dispatcher)."""
    from fairgate.dispatcher.admission_service import AdmissionServer
    from fairgate.ingress import admission_client

    submits = _Submits()
    server = AdmissionServer(submits, SECRET, 1 << 20)
    address = await server.start("127.0.0.1")

    async def where() -> str:
        return address

    abandoned: list[str] = []
    client = admission_client.AdmissionClient(where, SECRET.decode(), 5.0, lambda r: abandoned.append(r.request_id))
    answered = admission_client._AdmissionLink.on_message
    calls: list[asyncio.Task] = []

    def placed_then_left(link, reply):
        answered(link, reply)
        if reply.request_id == "raced":
            calls[0].cancel()

    try:
        await client.submit(pb.SubmitRequest(request_id="served", tenant="alice"))  # one link, used as usual
        admission_client._AdmissionLink.on_message = placed_then_left
        calls.append(asyncio.create_task(client.submit(pb.SubmitRequest(request_id="raced", tenant="alice"))))
        with pytest.raises(asyncio.CancelledError):
            await calls[0]
        assert abandoned == ["raced"]
    finally:
        admission_client._AdmissionLink.on_message = answered
        await client.close()
        await server.stop()
