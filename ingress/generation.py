"""The data plane of one request: stream from the assigned worker, apply stop strings, report usage.

Text goes worker -> ingress -> client; the dispatcher never sees it. Closing the iterator (client
gone, stop string found) cancels the gRPC call, and the worker aborts the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc

from common.rpc import fairgate_pb2 as pb
from common.rpc import fairgate_pb2_grpc as rpc


class WorkerLost(Exception):
    """The worker failed while the request was running."""


@dataclass
class Outcome:
    """Filled in as the stream goes; final once the iterator ends."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    received: bool = False  # the worker sent something: the request must not run anywhere else


class WorkerChannels:
    """One gRPC channel per worker address, reused across requests (created on the caller's loop)."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def stub(self, address: str) -> rpc.WorkerStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(address)
        return rpc.WorkerStub(channel)

    def forget(self, address: str) -> None:
        """Drop the channel to a worker that failed (closed in the background)."""
        channel = self._channels.pop(address, None)
        if channel is not None:
            asyncio.get_running_loop().create_task(channel.close())

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


async def stream_text(
    channels: WorkerChannels,
    address: str,
    request: pb.GenerateRequest,
    stops: list[str],
    outcome: Outcome,
    metadata: Sequence[tuple[str, str]] = (),
    on_first: Callable[[], None] | None = None,
) -> AsyncIterator[str]:
    """Yield text deltas; ``outcome`` holds usage and the finish reason when it ends. ``metadata`` goes
    with the call (trace context); ``on_first`` runs when the worker's first message arrives."""
    call = channels.stub(address).Generate(request, metadata=tuple(metadata) or None)
    held = ""  # text that could still be the start of a stop string
    keep = max((len(s) for s in stops), default=1) - 1
    try:
        async for chunk in call:
            if not outcome.received and on_first is not None:
                on_first()
            outcome.received = True
            outcome.prompt_tokens = chunk.prompt_tokens
            outcome.completion_tokens = chunk.completion_tokens
            held += chunk.text
            cut = min((i for i in (held.find(s) for s in stops) if i >= 0), default=-1)
            if cut >= 0:
                if held[:cut]:
                    yield held[:cut]
                outcome.finish_reason = "stop"
                return
            if chunk.finish_reason:
                if held:
                    yield held
                outcome.finish_reason = "stop" if chunk.finish_reason == "stop" else chunk.finish_reason
                return
            safe = len(held) - keep
            if safe > 0:
                yield held[:safe]
                held = held[safe:]
        raise WorkerLost("the worker ended the stream without finishing")
    except grpc.aio.AioRpcError as exc:
        raise WorkerLost(f"worker {address} failed: {exc.code().name}: {exc.details()}") from None
    finally:
        call.cancel()
