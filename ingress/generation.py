"""The data plane of one request: relay the engine's response bytes from the assigned worker.

Bytes go worker -> ingress -> client unchanged (the engine's own OpenAI layer wrote them on the
worker); the dispatcher never sees them. Closing the iterator (the client gone) cancels the gRPC call,
and the worker aborts the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc

from common.rpc import fairgate_pb2 as pb
from common.rpc import fairgate_pb2_grpc as rpc


class WorkerLost(Exception):
    """The worker failed while the request was running. Its text is what the client may read (no
    address, no exception text); ``detail`` is for the logs. ``retryable``: the failure says nothing
    about the request itself (the worker was unreachable, refused the ticket, or ended the stream), so
    another worker may serve it; otherwise placing it again would only fail again."""

    PUBLIC = "the worker serving this request failed"

    def __init__(self, detail: str, *, retryable: bool = True) -> None:
        super().__init__(self.PUBLIC)
        self.detail = detail
        self.retryable = retryable


# gRPC codes after which the request may run elsewhere: the worker is gone, or refused the ticket
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ABORTED}


@dataclass
class Outcome:
    """Filled in as the stream goes; final once the iterator ends."""

    status: int = 0
    content_type: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    received: bool = False  # the worker sent something: the request must not run anywhere else
    released: bool = False  # given up before anything arrived: its reservation was freed


@dataclass
class _Channel:
    channel: grpc.aio.Channel
    calls: int = 0  # calls open on it
    retired: bool = False  # replaced: closed once its last call ends


class WorkerChannels:
    """One gRPC channel per worker address, reused across requests (created on the caller's loop).

    Closing a channel cancels every call on it, so a channel is never closed while a call uses it:
    one request's failure must not end another tenant's stream. A channel to a worker that became
    unreachable is retired (new calls get a fresh one) and closed after its last call."""

    def __init__(self) -> None:
        self._channels: dict[str, _Channel] = {}

    def open(self, address: str) -> tuple[rpc.WorkerStub, _Channel]:
        entry = self._channels.get(address)
        if entry is None:
            entry = self._channels[address] = _Channel(grpc.aio.insecure_channel(address))
        entry.calls += 1
        return rpc.WorkerStub(entry.channel), entry

    def done(self, entry: _Channel) -> None:
        entry.calls -= 1
        if entry.retired and entry.calls == 0:
            asyncio.get_running_loop().create_task(entry.channel.close())

    def retire(self, address: str) -> None:
        """The worker at ``address`` could not be reached: later calls open a new channel."""
        entry = self._channels.pop(address, None)
        if entry is not None:
            entry.retired = True
            if entry.calls == 0:
                asyncio.get_running_loop().create_task(entry.channel.close())

    async def close(self) -> None:
        for entry in self._channels.values():
            await entry.channel.close()
        self._channels.clear()


async def stream_bytes(
    channels: WorkerChannels,
    address: str,
    request: pb.GenerateRequest,
    outcome: Outcome,
    metadata: Sequence[tuple[str, str]] = (),
    on_first: Callable[[], None] | None = None,
) -> AsyncIterator[bytes]:
    """Yield the engine's response bytes as the worker sends them; ``outcome`` holds the status and
    content type from the first chunk, and the counts and finish reason when it ends. ``metadata`` goes
    with the call (trace context); ``on_first`` runs when the worker's first message arrives."""
    stub, entry = channels.open(address)
    call = stub.Generate(request, metadata=tuple(metadata) or None)
    try:
        async for chunk in call:
            if not outcome.received:
                outcome.received = True
                outcome.status, outcome.content_type = chunk.status or 200, chunk.content_type
                if on_first is not None:
                    on_first()
            outcome.prompt_tokens = chunk.prompt_tokens
            outcome.completion_tokens = chunk.completion_tokens
            if chunk.data:
                yield chunk.data
            if chunk.finish_reason:
                outcome.finish_reason = chunk.finish_reason
                return
        raise WorkerLost(f"worker {address} ended the stream without finishing")
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            channels.retire(address)
        raise WorkerLost(f"worker {address}: {code.name}: {exc.details()}", retryable=code in RETRYABLE) from None
    finally:
        call.cancel()
        channels.done(entry)
