"""A worker replica running the shared engine model in real time, behind the real gRPC contracts.

It serves ``Worker.Generate`` on an ephemeral loopback port (checking the dispatcher's ticket before
generating anything), runs the engine (sleeping for each step's modelled duration), and keeps one
``Dispatcher.Connect`` stream: hello, one report per engine step, goodbye when draining; it obeys the
dispatcher's drain and abort. The vLLM worker will implement the same shape with ``AsyncLLM``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from dispatcher.tickets import TicketFields, check
from fairgate.rpc import fairgate_pb2 as pb
from fairgate.rpc import fairgate_pb2_grpc as rpc
from workers.engine import EngineRequest, SimulatedEngine, StepReport
from workers.engine.tokenizer import count_tokens, natural_length, stable_seed, token_text

log = logging.getLogger(__name__)


@dataclass
class _Stream:
    """What Generate is waiting for: deltas pushed by the engine loop."""

    tenant: str
    seed: int
    prompt_tokens: int
    queue: asyncio.Queue[tuple[int, str | None]]  # (new tokens, finish reason or None)
    generated: int = 0


class SimulatedWorker:
    def __init__(
        self,
        worker_id: str,
        dispatcher_address: str,
        secret: bytes,
        engine: SimulatedEngine,
        *,
        host: str = "127.0.0.1",
        reconnect_s: float = 0.2,
    ) -> None:
        self.worker_id = worker_id
        self.dispatcher_address = dispatcher_address
        self.engine = engine
        self._secret = secret
        self._host = host
        self._reconnect_s = reconnect_s
        self._streams: dict[str, _Stream] = {}
        self._outbox: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._draining = False
        self._released = asyncio.Event()
        self._stopped = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._server: grpc.aio.Server | None = None
        self.address = ""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        self._server = grpc.aio.server()
        rpc.add_WorkerServicer_to_server(_WorkerServicer(self), self._server)
        port = self._server.add_insecure_port(f"{self._host}:0")
        await self._server.start()
        self.address = f"{self._host}:{port}"
        self._tasks = [
            asyncio.create_task(self._engine_loop(), name=f"{self.worker_id}-engine"),
            asyncio.create_task(self._dispatcher_loop(), name=f"{self.worker_id}-dispatcher"),
        ]
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
        while (self.engine.has_work() or self._streams) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await self.stop()

    async def stop(self) -> None:
        """Stop at once (what runs is aborted)."""
        self._stopped.set()
        self._wake.set()
        self._outbox.put_nowait(None)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.stop(grace=0.5)

    # ------------------------------------------------------------------ engine

    async def _engine_loop(self) -> None:
        engine = self.engine
        while not self._stopped.is_set():
            duration = engine.begin_step()
            if duration is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(duration)
            report = engine.end_step()
            self._deliver(report)
            self._outbox.put_nowait(pb.WorkerMessage(report=_report_message(report)))

    def _deliver(self, report: StepReport) -> None:
        for rid, k in report.new_tokens.items():
            stream = self._streams.get(rid)
            if stream is not None:
                stream.queue.put_nowait((k, None))
        for done in report.finished:
            stream = self._streams.get(done.id)
            if stream is not None:
                stream.queue.put_nowait((0, done.reason))

    def admit(self, request_id: str, tenant: str, prompt: str, max_tokens: int, seed: int, ignore_eos: bool) -> _Stream:
        prompt_tokens = count_tokens(prompt)
        target = max_tokens if ignore_eos else min(max_tokens, natural_length(prompt, seed))
        stream = _Stream(tenant, seed, prompt_tokens, asyncio.Queue())
        self._streams[request_id] = stream
        self.engine.add(EngineRequest(request_id, prompt_tokens, max_tokens, target))
        self._wake.set()
        return stream

    def release(self, request_id: str) -> None:
        """The caller is gone or the request ended: stop generating for it."""
        if self._streams.pop(request_id, None) is not None:
            self.engine.abort(request_id)
            self._wake.set()

    # ------------------------------------------------------------------ dispatcher stream

    async def _dispatcher_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                async with grpc.aio.insecure_channel(self.dispatcher_address) as channel:
                    call = rpc.DispatcherStub(channel).Connect(self._messages())
                    async for msg in call:
                        self._on_dispatcher_message(msg)
            except (grpc.aio.AioRpcError, ConnectionError) as exc:
                log.info("worker %s: dispatcher stream ended: %s", self.worker_id, exc)
            if self._stopped.is_set():
                return
            if self._draining:  # the dispatcher is gone: nothing more can be on its way here
                self._released.set()
                return
            await asyncio.sleep(self._reconnect_s)

    async def _messages(self) -> AsyncIterator[pb.WorkerMessage]:
        yield pb.WorkerMessage(hello=self._hello())
        if self._draining:
            yield pb.WorkerMessage(goodbye=pb.Goodbye(reason="draining"))
        while True:
            msg = await self._outbox.get()
            if msg is None:
                return
            yield msg

    def _hello(self) -> pb.Hello:
        running = [
            pb.RunningRequest(request_id=rid, tenant=s.tenant, prompt_tokens=s.prompt_tokens, output_tokens=s.generated)
            for rid, s in self._streams.items()
        ]
        return pb.Hello(
            worker_id=self.worker_id,
            address=self.address,
            kv_tokens=self.engine.kv_tokens,
            max_running=self.engine.max_running or 0,
            free_tokens=self.engine.free_tokens,
            running=running,
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
    def __init__(self, worker: SimulatedWorker) -> None:
        self.worker = worker

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        w = self.worker
        t = request.ticket
        fields = TicketFields(t.request_id, t.tenant, t.worker_id, t.expires_at)
        problem = check(w._secret, fields, t.signature, w.worker_id, time.time())
        if problem is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, problem)
        if t.request_id in w._streams:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, "this request is already running here")
        seed = request.seed if request.has_seed else stable_seed(t.request_id)
        stream = w.admit(t.request_id, t.tenant, request.prompt, request.max_tokens, seed, request.ignore_eos)
        try:
            while True:
                k, reason = await stream.queue.get()
                text = "".join(token_text(seed, stream.generated + i) for i in range(k))
                stream.generated += k
                if k:
                    yield pb.GenerateChunk(
                        text=text, completion_tokens=stream.generated, prompt_tokens=stream.prompt_tokens
                    )
                if reason is not None:
                    yield pb.GenerateChunk(
                        completion_tokens=stream.generated, prompt_tokens=stream.prompt_tokens, finish_reason=reason
                    )
                    return
        finally:
            w.release(t.request_id)


def _report_message(report: StepReport) -> pb.StepReport:
    return pb.StepReport(
        started=[pb.Started(request_id=rid, prompt_tokens=n) for rid, n in report.started.items()],
        new_tokens=[pb.TokenCount(request_id=rid, tokens=k) for rid, k in report.new_tokens.items()],
        finished=[
            pb.Finished(request_id=f.id, output_tokens=f.output_tokens, reason=f.reason) for f in report.finished
        ],
        free_tokens=report.free_tokens,
        running=report.running,
        waiting=report.waiting,
        step_seconds=report.duration_s,
    )
