"""A worker replica's shell: one engine runner behind the real gRPC contracts.

It serves ``Worker.Generate`` on an ephemeral loopback port (checking the dispatcher's ticket before
generating anything), drives its runner (the simulated engine or vLLM), and keeps one
``Dispatcher.Connect`` stream: hello, one report per engine step, goodbye when draining; it obeys the
dispatcher's drain and abort. Everything engine-specific lives in the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc

from common.rpc import fairgate_pb2 as pb
from common.rpc import fairgate_pb2_grpc as rpc
from common.tickets import WORKER_AUTH_HEADER, TicketBook, check, check_size, ticket_fields, worker_token
from common.tracing import extract_context, tracer
from workers.engines.interface import EngineRunner, GenerationParams, StepReport

log = logging.getLogger(__name__)

GENERATED_KEPT = 50_000
ENDED_KEPT_S = 150.0  # a hello lists what ended this long ago (the dispatcher forgets lost requests at 120 s)
ENDED_KEPT = 20_000


@dataclass
class _Running:
    """A request this worker runs, as re-announced in a hello after a dispatcher restart."""

    tenant: str
    prompt_tokens: int
    max_tokens: int
    reported: int = 0  # output tokens in the step reports made so far (what a hello re-announces)
    started: bool = False  # the engine started it (reported so)


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
        reconnect_s: float = 0.2,
        max_reconnect_s: float = 3.0,
    ) -> None:
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
        # request id -> times generated here, for the last GENERATED_KEPT ids (tests check "never twice")
        self.generated: OrderedDict[str, int] = OrderedDict()
        self._outbox: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        self._draining = False
        self._released = asyncio.Event()
        self._stopped = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._server: grpc.aio.Server | None = None
        self._tickets = TicketBook()  # tickets served: each once
        self.address = ""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        self._server = grpc.aio.server()
        rpc.add_WorkerServicer_to_server(_WorkerServicer(self), self._server)
        port = self._server.add_insecure_port(f"{self._host}:0")
        await self._server.start()
        self.address = f"{self._host}:{port}"
        await self.runner.start(self._on_step)
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
            await asyncio.wait_for(self._released.wait(), timeout_s)
        while (self.runner.has_work() or self._running) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await self.stop()

    async def stop(self) -> None:
        """Stop at once (what runs is aborted)."""
        self._stopped.set()
        self._outbox.put_nowait(None)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.stop(grace=0.5)
        await self.runner.stop()

    # ------------------------------------------------------------------ engine

    def _on_step(self, report: StepReport) -> None:
        running = self._running
        for rid, n in report.started.items():
            if rid in running:
                running[rid].prompt_tokens = n
                running[rid].started = True
        for rid, k in report.new_tokens.items():
            if rid in running:
                running[rid].reported += k
        self._outbox.put_nowait(pb.WorkerMessage(report=_report_message(report, running)))

    def _remember_ended(self, request_id: str, r: _Running, output_tokens: int) -> None:
        """Keep what a request that ran here ended with, for the hellos of the next minutes."""
        if not (r.started or output_tokens):
            return  # never reached the engine: nothing to settle but a refund, which its finish makes
        now, ended = time.monotonic(), self._ended
        r.reported = output_tokens
        ended[request_id] = (r, now)
        while ended and (len(ended) > ENDED_KEPT or next(iter(ended.values()))[1] < now - ENDED_KEPT_S):
            ended.popitem(last=False)

    def release(self, request_id: str) -> None:
        """The dispatcher aborted the request: stop generating for it (its stream ends with 'abort')."""
        if request_id in self._running:
            self.runner.abort(request_id)

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
        stale, outbox = self._outbox, asyncio.Queue()
        self._outbox = outbox
        stale.put_nowait(None)
        yield pb.WorkerMessage(hello=self._hello())
        if self._draining:
            yield pb.WorkerMessage(goodbye=pb.Goodbye(reason="draining"))
        while True:
            msg = await outbox.get()
            if msg is None:
                return
            yield msg

    def _hello(self) -> pb.Hello:
        running = [_announced(rid, r) for rid, r in self._running.items()]
        ended = [_announced(rid, r) for rid, (r, _) in self._ended.items()]
        return pb.Hello(
            worker_id=self.worker_id,
            address=self.address,
            kv_tokens=self.runner.kv_tokens,
            max_running=self.runner.max_running or 0,
            free_tokens=self.runner.free_tokens(),
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


class _WorkerServicer(rpc.WorkerServicer):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        w = self.worker
        t = request.ticket
        fields = ticket_fields(t)
        now = time.time()
        problem = check(w._secret, fields, t.signature, w.worker_id, now)
        if problem is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, problem)
        problem = check_size(fields, request.prompt_tokens, request.max_tokens)
        if problem is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, problem)
        if t.request_id in w._running:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, "this request is already running here")
        if not w._tickets.take(t.signature, t.expires_at, now):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this ticket was used already")
        params = GenerationParams(
            prompt=request.prompt,
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed if request.has_seed else None,
            stop=tuple(request.stop),
            ignore_eos=request.ignore_eos,
            templated=request.templated,
        )
        span = tracer().start_span(
            "fairgate.worker.generate",
            context=extract_context(context.invocation_metadata()),
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
        w._running[t.request_id] = _Running(t.tenant, request.prompt_tokens, request.max_tokens)
        deltas = w.runner.generate(t.request_id, params)
        held: list[str] = []  # final_only: the text so far, sent once at the end
        first = True
        completion_tokens = 0
        try:
            async for delta in deltas:
                completion_tokens = delta.completion_tokens
                if request.final_only and not delta.finish_reason:
                    held.append(delta.text)
                    if not first:
                        continue
                    text = ""  # the first chunk only says "it started here" (then it must not run elsewhere)
                else:
                    text = "".join([*held, delta.text])
                    held.clear()
                first = False
                yield pb.GenerateChunk(
                    text=text,
                    completion_tokens=delta.completion_tokens,
                    prompt_tokens=delta.prompt_tokens,
                    finish_reason=delta.finish_reason or "",
                )
                if delta.finish_reason:
                    return
        except (ValueError, TypeError) as exc:  # the engine refused this request: it alone fails
            log.warning("worker %s: the engine refused %s: %s", w.worker_id, t.request_id, exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the engine refused the request")
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception:
            log.exception("worker %s: the engine failed on %s", w.worker_id, t.request_id)
            await context.abort(grpc.StatusCode.INTERNAL, "the engine failed on the request")
        finally:
            await deltas.aclose()  # type: ignore[attr-defined]  # aborts the request if it still runs
            ended = w._running.pop(t.request_id, None)
            if ended is not None:
                w._remember_ended(t.request_id, ended, completion_tokens)
            span.set_attribute("fairgate.completion_tokens", completion_tokens)
            span.end()


def _announced(request_id: str, r: _Running) -> pb.RunningRequest:
    """A request as a hello re-announces it, with every output token reported for it."""
    return pb.RunningRequest(
        request_id=request_id,
        tenant=r.tenant,
        prompt_tokens=r.prompt_tokens,
        output_tokens=r.reported,
        max_tokens=r.max_tokens,
    )


def _report_message(report: StepReport, running: dict[str, _Running]) -> pb.StepReport:
    started = []
    for rid, n in report.started.items():
        r = running.get(rid)
        tenant, max_tokens = (r.tenant, r.max_tokens) if r else ("", 0)
        started.append(pb.Started(request_id=rid, prompt_tokens=n, tenant=tenant, max_tokens=max_tokens))
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
    )
