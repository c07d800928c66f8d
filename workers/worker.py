"""A worker replica's shell: one engine runner behind fairgate's contracts.

It serves the data plane (``GenerateRequest`` frames from the ingress, ``workers/generate_server.py``)
on an ephemeral loopback port, checking the dispatcher's ticket before generating anything; drives its
runner (the simulated engine or vLLM); and keeps one gRPC ``Dispatcher.Connect`` stream: hello, one
report per engine step, goodbye when draining; it obeys the dispatcher's drain and abort. Everything
engine-specific lives in the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from fairgate.common.frame_guard import DATA_PLANE_HOP, DEFAULT_FRAME_BYTES, Guard, hop_key
from fairgate.common.openai_errors import ApiError
from fairgate.common.rpc import fairgate_pb2 as pb
from fairgate.common.rpc import fairgate_pb2_grpc as rpc
from fairgate.common.tickets import WORKER_AUTH_HEADER, TicketBook, check, check_size, ticket_fields, worker_token
from fairgate.common.tracing import extract_context, tracer
from fairgate.common.waits import within
from fairgate.core.reasons import FINISH_REVOKED
from fairgate.workers.asgi_call import AsgiResponse, Linger, call_asgi
from fairgate.workers.body_limits import ENDPOINT_PATHS, BodyRefused, admitted_body, tenant_cache_salt
from fairgate.workers.engines.interface import ASGIApp, EngineRunner, StepReport, TicketGrant, current_grant
from fairgate.workers.generate_server import GenerateServer
from fairgate.workers.report_outbox import ReportOutbox
from fairgate.workers.stream_text import carries_text

log = logging.getLogger(__name__)

GENERATED_KEPT = 50_000
ENDED_KEPT_S = 150.0  # a hello lists what ended this long ago (the dispatcher keeps its side 160-320 s)
ENDED_KEPT = 20_000
LEAVING_KEPT = 10_000  # requests left by their callers that the engine has not finished yet
# A stream's bytes are relayed at most once per this interval, joined: far fewer messages per token
# when an engine steps fast (each message costs the worker, the ingress and the client CPU; figures in
# docs/speed.md); the pieces up to the first that carries generated text (the first token, as its client
# times it), a piece after a quiet interval (a GPU's 25-40 ms steps) and the pieces after the engine
# finished the request (a client's next request may wait on them) go at once.
RELAY_LINGER_S = 0.025
# Step reports go to the dispatcher at most once per this interval, the steps in between merged: a GPU's
# steps (20-40 ms) each go alone, at once; an engine stepping every millisecond does not cost a gRPC
# message (CPU at each end) per step. It is the pace while requests wait in the
# dispatcher, for a report that says a request started or finished (the dispatcher learns of either at
# most this much later), and a worker's pace until the dispatcher says otherwise (``Pace``: longer
# while nothing waits, at most REPORT_LINGER_MAX_S).
REPORT_LINGER_S = 0.005
REPORT_LINGER_MAX_S = 0.5
# arrivals ride the next step report; in a step longer than this they go on their own
ARRIVAL_REPORT_S = 1.0
# a request's last bytes wait at most this long for the report of its end to be written (a stream to the
# dispatcher that is down writes nothing: the next hello says what ended)
END_REPORT_WAIT_S = 1.0


@dataclass
class _Running:
    """A request this worker runs, as re-announced in a hello after a dispatcher restart."""

    tenant: str
    prompt_tokens: int
    max_tokens: int
    reported: int = 0  # output tokens in the step reports made so far (what a hello re-announces)
    ticket_expires_at: float = 0.0  # on its dispatcher's clock (a restarted dispatcher reads it)
    started: bool = False  # the engine started it (reported so)
    finish: str = ""  # how the engine ended it, once reported ("revoked": taken back unstarted)
    end_report: tuple[ReportOutbox, int] | None = None  # where the report of its end was put
    linger: Linger = field(default_factory=lambda: Linger(RELAY_LINGER_S, carries_text))  # its bytes' joining


class Worker:
    """``dispatcher``: the dispatcher's address, or a coroutine function that finds it (its address
    changes when it restarts). Lost streams are re-opened with exponential backoff and jitter."""

    def __init__(
        self,
        worker_id: str,
        dispatcher: str | Callable[[], Awaitable[str]],
        secret: bytes,
        runner: EngineRunner,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame_bytes: int = DEFAULT_FRAME_BYTES,
        reconnect_s: float = 0.2,
        max_reconnect_s: float = 3.0,
    ) -> None:
        """``port``: the data plane's (0: any free one); ``max_frame_bytes``: the longest request frame
        an ingress may send (its largest body, and slack)."""
        self.worker_id = worker_id
        self._locate = dispatcher if callable(dispatcher) else None
        self.dispatcher_address = "" if callable(dispatcher) else dispatcher
        self.runner = runner
        self._secret = secret
        self._host = host
        self._reconnect_s = reconnect_s
        self._max_reconnect_s = max_reconnect_s
        self._running: dict[str, _Running] = {}
        # what ended here lately, with its final count as ``reported``: a hello re-announces it (its last
        # reports may have been lost with a broken stream); request id -> (request, when it ended)
        self._ended: OrderedDict[str, tuple[_Running, float]] = OrderedDict()
        # requests whose caller left while the engine still had them (a prefill under way): their step
        # reports still name their tenant, so the dispatcher charges what the engine did for them
        self._leaving: OrderedDict[str, _Running] = OrderedDict()
        # request id -> times generated here, for the last GENERATED_KEPT ids (tests check "never twice")
        self.generated: OrderedDict[str, int] = OrderedDict()
        self._outbox = ReportOutbox()
        self._arrived: list[str] = []  # requests arrived since the last report
        self._figures: tuple[int, int, int] | None = None  # the last step report's free KV, running, waiting
        self._report_linger = REPORT_LINGER_S  # the dispatcher's pace for step reports
        self._hurry = asyncio.Event()  # the pace changed, or a request started or ended: a held report goes
        self._urgent = False  # a request started or finished since the last report went
        self._draining = False
        self._released = asyncio.Event()
        self._stopped = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        guard = Guard(hop_key(secret, DATA_PLANE_HOP), max_frame_bytes)
        self._server = GenerateServer(lambda request: generate(self, request), guard)
        self._port = port
        self._tickets = TicketBook()  # tickets served: each once
        self._salts: dict[str, str] = {}
        self.openai_app: ASGIApp | None = None  # the engine's own OpenAI layer, once started
        self.address = ""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        self.address = await self._server.start(self._host, self._port)
        await self.runner.start(self._on_step)
        self.openai_app = await self.runner.openai_app()
        self._tasks = [asyncio.create_task(self._dispatcher_loop(), name=f"{self.worker_id}-dispatcher")]
        return self.address

    async def drain(self, timeout_s: float = 600.0) -> None:
        """Say goodbye, wait until the dispatcher has nothing more on its way here, finish what runs,
        then stop. Requests assigned before the goodbye are still served."""
        if not self._draining:
            self._draining = True
            self._outbox.put_nowait(pb.WorkerMessage(goodbye=pb.Goodbye(reason="draining")))
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(TimeoutError):
            await within(self._released.wait(), timeout_s)
        while (self.runner.has_work() or self._running) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await self.stop()

    async def stop(self) -> None:
        """Stop at once (what runs is aborted)."""
        self._stopped.set()
        self._outbox.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._server.stop(grace_s=0.5)
        await self.runner.stop()

    # ------------------------------------------------------------------ engine

    def _on_step(self, report: StepReport) -> None:
        running = self._running
        if report.started or report.finished:
            self._urgent = True
            self._hurry.set()
        leaving, ended = self._leaving, self._ended

        def held(rid: str) -> _Running | None:
            return running.get(rid) or leaving.get(rid)

        for rid, n in report.started.items():
            r = held(rid)
            if r is not None:
                r.prompt_tokens = n
                r.started = True
        for rid, k in report.new_tokens.items():
            r = held(rid) or (ended[rid][0] if rid in ended else None)  # ended: its last step came late
            if r is not None:
                r.reported += k
        message = _report_message(report, held)
        if self._arrived:
            message.arrived.extend(self._arrived)
            self._arrived.clear()
        self._figures = (message.free_tokens, message.running, message.waiting)
        outbox = self._outbox
        position = outbox.put_nowait(pb.WorkerMessage(report=message))
        for f in report.finished:
            r = running.get(f.id)
            if r is not None:
                r.finish = f.reason
                r.end_report = (outbox, position)
                r.linger.end()  # its last bytes go at once
            gone = leaving.pop(f.id, None)
            if gone is not None:
                self._remember_ended(f.id, gone, f.output_tokens)

    async def end_reported(self, r: _Running) -> None:
        """Until the dispatcher has applied the report of ``r``'s end (the engine's last step report for
        it has come by now, if its response has ended)."""
        await asyncio.sleep(0)
        if r.end_report is not None:
            outbox, position = r.end_report
            await outbox.until_acked(position, END_REPORT_WAIT_S)

    def arrived(self, request_id: str) -> None:
        """A request reached this worker with a valid ticket: the next report says so, within
        ``ARRIVAL_REPORT_S`` even when the engine is in the middle of a long step."""
        self._arrived.append(request_id)
        if len(self._arrived) == 1:
            asyncio.get_running_loop().call_later(ARRIVAL_REPORT_S, self._report_arrivals)

    def _report_arrivals(self) -> None:
        """Arrivals no step report has carried yet, on their own, with the last step's figures."""
        if self._arrived:
            free, running, waiting = self._figures or (self.runner.free_tokens(), 0, 0)
            report = pb.StepReport(arrived=self._arrived, free_tokens=free, running=running, waiting=waiting)
            self._arrived.clear()
            self._outbox.put_nowait(pb.WorkerMessage(report=report))

    def _left(self, request_id: str, r: _Running) -> None:
        """Its caller left while the engine still had it: kept until the engine says it ended."""
        self._leaving[request_id] = r
        while len(self._leaving) > LEAVING_KEPT:
            self._leaving.popitem(last=False)

    def _remember_ended(self, request_id: str, r: _Running, output_tokens: int) -> None:
        """Keep what a request that ran here ended with, for the hellos of the next minutes."""
        if not _ran(r, output_tokens):
            return  # never reached the engine: nothing to settle but a refund, which its finish makes
        now, ended = time.monotonic(), self._ended
        r.reported = output_tokens
        ended[request_id] = (r, now)
        while ended and (len(ended) > ENDED_KEPT or next(iter(ended.values()))[1] < now - ENDED_KEPT_S):
            ended.popitem(last=False)

    def settle_unreached(self, request_id: str) -> None:
        """A request admitted here that never reached the engine (its body was refused): the dispatcher
        frees what it reserved and refunds it now."""
        finished = pb.Finished(request_id=request_id, output_tokens=0, reason="abort")
        report = pb.StepReport(finished=[finished], free_tokens=self.runner.free_tokens())
        self._outbox.put_nowait(pb.WorkerMessage(report=report))

    def cache_salt(self, tenant: str) -> str:
        salt = self._salts.get(tenant)
        if salt is None:
            if len(self._salts) > 100_000:
                self._salts.clear()
            salt = self._salts[tenant] = tenant_cache_salt(self._secret, tenant)
        return salt

    def release(self, request_id: str) -> None:
        """The dispatcher aborted the request: stop generating for it (its stream ends with 'abort')."""
        if request_id in self._running:
            self.runner.abort(request_id)

    def revoke(self, request_id: str) -> None:
        """The dispatcher takes the request back if the engine has not started it: then it never runs
        here, the dispatcher hears ``revoked`` (it waits again), and the ingress gets a ``revoked``
        refusal, nothing of it having been sent. A request that started runs on; nothing is said."""
        r = self._running.get(request_id)
        if r is None or r.started or r.finish or not self.runner.revoke(request_id):
            return
        r.finish = FINISH_REVOKED
        r.linger.end()
        finished = pb.Finished(request_id=request_id, output_tokens=0, reason=FINISH_REVOKED)
        report = pb.StepReport(finished=[finished], free_tokens=self.runner.free_tokens())
        self._outbox.put_nowait(pb.WorkerMessage(report=report))

    # ------------------------------------------------------------------ dispatcher stream

    async def _dispatcher_loop(self) -> None:
        delay = self._reconnect_s
        while not self._stopped.is_set():
            welcomed = False
            try:
                if self._locate is not None:
                    self.dispatcher_address = await self._locate()
                async with grpc.aio.insecure_channel(self.dispatcher_address) as channel:
                    token = worker_token(self._secret, self.worker_id, self.address, time.time())
                    call = rpc.DispatcherStub(channel).Connect(
                        self._messages(), metadata=((WORKER_AUTH_HEADER, token),)
                    )
                    async for msg in call:
                        welcomed = welcomed or msg.WhichOneof("kind") == "welcome"
                        self._on_dispatcher_message(msg)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # gRPC errors, or the dispatcher actor restarting
                log.info("worker %s: dispatcher stream ended: %s", self.worker_id, exc)
            if self._stopped.is_set():
                return
            if self._draining:  # the dispatcher is gone: nothing more can be on its way here
                self._released.set()
                return
            delay = self._reconnect_s if welcomed else min(self._max_reconnect_s, delay * 2)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))

    async def _messages(self) -> AsyncIterator[pb.WorkerMessage]:
        """One connection's messages. Each connection gets a fresh outbox, and the last one is closed,
        so a stream that died can never take messages meant for its successor. Reports not yet sent
        are dropped: the hello re-announces every running request with all the tokens reported so
        far, so a dispatcher charges each token once."""
        if self._stopped.is_set():
            return
        stale, outbox = self._outbox, ReportOutbox()
        self._outbox = outbox
        self._report_linger = REPORT_LINGER_S  # a dispatcher (maybe a new one) sets its pace anew
        stale.close()
        yield pb.WorkerMessage(hello=self._hello())
        if self._draining:
            yield pb.WorkerMessage(goodbye=pb.Goodbye(reason="draining"))
        held: pb.WorkerMessage | None = None  # a message taken while merging, sent next
        loop = asyncio.get_running_loop()
        reported = 0.0  # when the last report went
        while True:
            msg, held = (held, None) if held is not None else (await outbox.get(), None)
            if msg is None:
                return
            if msg.WhichOneof("kind") != "report":
                yield msg
                continue
            await self._report_pace(reported)  # steps faster than the pace: theirs go as one message
            reported = loop.time()
            if not outbox.empty():
                msg, held = _merge_queued(msg, outbox)
            self._urgent = False
            if msg.report.finished:  # its ends' last bytes wait for the dispatcher to count them
                msg.report.ack = outbox.sending(held=int(held is not None and held is not _CLOSED))
            yield msg
            if held is _CLOSED:
                return

    async def _report_pace(self, reported: float) -> None:
        """Until the next report may go: the dispatcher's pace after the last one (``reported``), or the
        fast pace once a request has started or finished since, or the dispatcher asks for it. Starts:
        admission counts the requests on their way to an engine until it hears they started. Finishes:
        a client reading its usage right after its answer finds it charged. A request's first tokens come
        in its start's step, so the dispatcher's first-token latency never waits on the pace."""
        loop = asyncio.get_running_loop()
        while True:
            fast = self._urgent or self._report_linger <= REPORT_LINGER_S
            wait = reported + (REPORT_LINGER_S if fast else self._report_linger) - loop.time()
            if wait <= 0:
                return
            if fast:
                await asyncio.sleep(wait)
                return
            self._hurry.clear()
            with contextlib.suppress(TimeoutError):
                await within(self._hurry.wait(), wait)

    def _hello(self) -> pb.Hello:
        """Who this worker is, what runs here, and what ended lately. A request whose end its engine
        reported but whose client has not had its last bytes yet is announced as ended: the report that
        said so may have gone with the broken stream."""
        running = [_announced(rid, r) for rid, r in self._running.items() if not r.finish]
        ended = [_announced(rid, r) for rid, (r, _) in self._ended.items()]
        ended += [_announced(rid, r) for rid, r in self._running.items() if r.finish and _ran(r, r.reported)]
        return pb.Hello(
            worker_id=self.worker_id,
            address=self.address,
            kv_tokens=self.runner.kv_tokens,
            max_running=self.runner.max_running or 0,
            free_tokens=self.runner.free_tokens(),
            watermark_tokens=self.runner.watermark_tokens,
            max_loras=self.runner.max_loras or 0,
            running=running,
            ended=ended,
        )

    def _on_dispatcher_message(self, msg: pb.DispatcherMessage) -> None:
        kind = msg.WhichOneof("kind")
        if kind == "drain":
            asyncio.get_running_loop().create_task(self.drain())
        elif kind == "released":
            self._released.set()
        elif kind == "abort":
            self.release(msg.abort.request_id)
        elif kind == "revoke":
            self.revoke(msg.revoke.request_id)
        elif kind == "acked":
            self._outbox.acked(msg.acked)
        elif kind == "pace":
            linger = min(REPORT_LINGER_MAX_S, max(REPORT_LINGER_S, msg.pace.report_interval_s))
            self._report_linger = linger
            self._hurry.set()  # a held report goes at the new pace


class _Refused(Exception):
    """The worker does not serve this request: the ingress gets a ``Refusal`` instead of bytes."""

    def __init__(self, code: str, detail: str, retryable: bool) -> None:
        super().__init__(detail)
        self.refusal = pb.Refusal(code=code, detail=detail, retryable=retryable)


async def generate(w: Worker, request: pb.GenerateRequest) -> AsyncIterator[pb.GenerateChunk]:
    """Serve one admitted OpenAI request with the engine's own OpenAI layer and yield its bytes as
    chunks, the last one saying how it ended. A request the worker refuses gets one chunk naming why
    (``refusal``). Closing the iterator early (the ingress left) aborts the request in the engine."""
    try:
        _check_ticket(w, request)
    except _Refused as exc:
        yield pb.GenerateChunk(refusal=exc.refusal)
        return
    t = request.ticket
    try:
        body = admitted_body(json.loads(request.body), request.max_tokens, request.choices, request.endpoint)
    except (ValueError, RecursionError) as exc:  # BodyRefused, or JSON the ingress let through
        w.settle_unreached(t.request_id)
        yield _refusal(400, str(exc) if isinstance(exc, BodyRefused) else "the request body is not valid JSON")
        return
    body["cache_salt"] = w.cache_salt(t.cache_group or t.tenant)  # its sharing group's, else its own
    if t.adapter:  # the adapter its ticket names, whatever the body says: loaded now if it is not yet
        body["model"] = t.adapter
        try:
            await w.runner.prepare_adapter(t.adapter, t.adapter_path)
        except Exception as exc:
            w.settle_unreached(t.request_id)
            log.warning("worker: adapter %s could not be loaded from %s: %s", t.adapter, t.adapter_path, exc)
            yield _refusal(500, f"the adapter {t.adapter!r} could not be loaded", "server_error", "adapter_unavailable")
            return
    span = tracer().start_span(
        "fairgate.worker.generate",
        context=extract_context(request.trace_context),
        attributes={
            "fairgate.request_id": t.request_id,
            "fairgate.tenant": t.tenant,
            "fairgate.worker": w.worker_id,
            "fairgate.prompt_tokens": request.prompt_tokens,
        },
    )
    w.generated[t.request_id] = w.generated.get(t.request_id, 0) + 1
    if len(w.generated) > GENERATED_KEPT:
        w.generated.popitem(last=False)
    running = w._running[t.request_id] = _Running(
        t.tenant, request.prompt_tokens, request.max_tokens, ticket_expires_at=t.expires_at
    )
    w.arrived(t.request_id)
    scope = contextvars.copy_context()
    grant = TicketGrant(
        t.request_id, t.tenant, body["cache_salt"], t.priority, t.adapter, t.adapter_path, t.cache_group or t.tenant
    )
    scope.run(current_grant.set, grant)
    response = None
    assert w.openai_app is not None
    try:
        # the engine's layer names its response after this (vLLM: "chatcmpl-" + it): the gateway's id
        headers = {"content-type": "application/json", "x-request-id": t.request_id.partition("-")[2] or t.request_id}
        path = ENDPOINT_PATHS[request.endpoint]
        response = await call_asgi(w.openai_app, path, json.dumps(body).encode(), headers, scope, running.linger)
        first, whole = True, b""
        if response.complete:  # a whole answer at once: it goes in the last chunk, saying how it ended
            whole = b"".join([piece async for piece in response.body])
        else:
            async for piece in response.body:
                if running.finish == FINISH_REVOKED:
                    break
                chunk = pb.GenerateChunk(
                    data=piece, completion_tokens=running.reported, prompt_tokens=running.prompt_tokens
                )
                if first:
                    chunk.status, chunk.content_type, first = response.status, response.content_type, False
                yield chunk
        if running.finish == FINISH_REVOKED:  # taken back before it started: nothing of it was sent
            yield _taken_back()
            return
        await w.end_reported(running)  # a whole answer is never one nobody charged
        yield _last_chunk(running, response, whole, head=first)
    except (asyncio.CancelledError, GeneratorExit):
        raise
    except Exception:
        if running.finish == FINISH_REVOKED:  # the engine's layer failed on a stream taken back: said so
            yield _taken_back()
            return
        log.exception("worker %s: the engine failed on %s", w.worker_id, t.request_id)
        yield pb.GenerateChunk(refusal=pb.Refusal(code="internal", detail="the engine failed on the request"))
    finally:
        if response is not None:
            await response.body.aclose()  # type: ignore[attr-defined]  # the client left: abort it now
        ended = w._running.pop(t.request_id, None)
        if not w.runner.pop_reached(t.request_id):
            w.settle_unreached(t.request_id)
        elif ended is not None and not ended.finish:  # the engine has not said it ended: it may still report
            w._left(t.request_id, ended)
        elif ended is not None:
            w._remember_ended(t.request_id, ended, ended.reported)
        span.set_attribute("fairgate.completion_tokens", running.reported)
        span.end()


def _taken_back() -> pb.GenerateChunk:
    """The answer for a request taken back before its engine started it: the ingress asks again."""
    return pb.GenerateChunk(refusal=pb.Refusal(code=FINISH_REVOKED, detail="taken back unstarted", retryable=True))


def _last_chunk(running: _Running, response: AsgiResponse, data: bytes = b"", head: bool = False) -> pb.GenerateChunk:
    """A request's last chunk: the engine's exact counts and how it ended (``head``: with the status and
    content type, when no chunk carried them yet)."""
    chunk = pb.GenerateChunk(
        data=data,
        completion_tokens=running.reported,
        prompt_tokens=running.prompt_tokens,
        finish_reason=running.finish or ("stop" if response.status < 400 else "error"),
    )
    if head:
        chunk.status, chunk.content_type = response.status, response.content_type
    return chunk


def _check_ticket(w: Worker, request: pb.GenerateRequest) -> None:
    """A valid, unexpired ticket naming this worker, for no more than it admitted, used once."""
    t = request.ticket
    fields = ticket_fields(t)
    now = time.time()
    problem = check(w._secret, fields, t.signature, w.worker_id, now)
    if problem is None:
        problem = check_size(fields, request.prompt_tokens, request.max_tokens)
    if problem is not None:
        raise _Refused("permission_denied", problem, retryable=True)
    if t.request_id in w._running:
        raise _Refused("already_exists", "this request is already running here", retryable=False)
    if request.endpoint not in ENDPOINT_PATHS:
        raise _Refused("invalid_argument", f"unknown endpoint {request.endpoint!r}", retryable=False)
    if not w._tickets.take(t.signature, t.expires_at, now):
        raise _Refused("permission_denied", "this ticket was used already", retryable=True)


def _refusal(
    status: int, message: str, type_: str = "invalid_request_error", code: str = "invalid_request"
) -> pb.GenerateChunk:
    body = ApiError(status, message, type_=type_, code=code).body()
    return pb.GenerateChunk(
        data=json.dumps(body).encode(), status=status, content_type="application/json", finish_reason="error"
    )


def _ran(r: _Running, output_tokens: int) -> bool:
    """Whether a request that ended reached its engine: then its end is settled by what it ran (else
    only a refund is due, which its finish makes)."""
    return r.started or output_tokens > 0


def _announced(request_id: str, r: _Running) -> pb.RunningRequest:
    """A request as a hello re-announces it, with every output token reported for it."""
    return pb.RunningRequest(
        request_id=request_id,
        tenant=r.tenant,
        prompt_tokens=r.prompt_tokens,
        output_tokens=r.reported,
        max_tokens=r.max_tokens,
        ticket_expires_at=r.ticket_expires_at,
    )


_CLOSED = pb.WorkerMessage()  # the outbox's end, found while merging


def _merge_queued(msg: pb.WorkerMessage, outbox: ReportOutbox) -> tuple[pb.WorkerMessage, pb.WorkerMessage | None]:
    """Step reports that queued up while the stream was busy, as one message (fewer writes and
    fewer reads at the dispatcher, nothing delayed): starts and finishes in order, tokens summed per
    request, the pool's figures from the last step. Returns it and the first queued message that is
    not a report (``_CLOSED`` for the outbox's end), which goes next."""
    merged = pb.StepReport()
    merged.CopyFrom(msg.report)
    tokens: dict[str, int] = {}
    for t in merged.new_tokens:
        tokens[t.request_id] = tokens.get(t.request_id, 0) + t.tokens
    held: pb.WorkerMessage | None = None
    while not outbox.empty():
        nxt = outbox.get_nowait()
        if nxt is None or nxt.WhichOneof("kind") != "report":
            held = _CLOSED if nxt is None else nxt
            break
        r = nxt.report
        merged.started.extend(r.started)
        merged.finished.extend(r.finished)
        merged.kv_events.extend(r.kv_events)
        merged.arrived.extend(r.arrived)
        for t in r.new_tokens:
            tokens[t.request_id] = tokens.get(t.request_id, 0) + t.tokens
        merged.free_tokens, merged.running, merged.waiting = r.free_tokens, r.running, r.waiting
        merged.step_seconds += r.step_seconds
        if r.adapters or r.host_adapters:  # where adapters are: the last step's
            merged.adapters[:] = r.adapters
            merged.host_adapters[:] = r.host_adapters
        for name, seconds in r.adapter_load_seconds.items():  # loads: all of them
            merged.adapter_load_seconds[name] = merged.adapter_load_seconds.get(name, 0.0) + seconds
            merged.adapter_loads[name] = merged.adapter_loads.get(name, 0) + r.adapter_loads.get(name, 1)
    del merged.new_tokens[:]
    merged.new_tokens.extend(pb.TokenCount(request_id=rid, tokens=k) for rid, k in tokens.items())
    return pb.WorkerMessage(report=merged), held


def _report_message(report: StepReport, known: Callable[[str], _Running | None]) -> pb.StepReport:
    """A step's report, each started request with its tenant (``known``: what this worker holds of it)."""
    started = []
    for rid, n in report.started.items():
        r = known(rid)
        tenant, max_tokens = (r.tenant, r.max_tokens) if r else ("", 0)
        cached = report.cached.get(rid, 0)
        started.append(
            pb.Started(request_id=rid, prompt_tokens=n, tenant=tenant, max_tokens=max_tokens, cached_tokens=cached)
        )
    return pb.StepReport(
        started=started,
        new_tokens=[pb.TokenCount(request_id=rid, tokens=k) for rid, k in report.new_tokens.items()],
        finished=[
            pb.Finished(request_id=f.id, output_tokens=f.output_tokens, reason=f.reason) for f in report.finished
        ],
        free_tokens=report.free_tokens,
        running=report.running,
        waiting=report.waiting,
        step_seconds=report.duration_s,
        adapters=report.adapters,
        host_adapters=report.host_adapters,
        adapter_load_seconds=report.adapter_loads,
        adapter_loads={name: 1 for name in report.adapter_loads},
        kv_events=[pb.KvEvent(kind=k, medium=m, hashes=h) for k, m, h in report.kv_events],
    )
