"""The ingress's side of the dispatcher's Admission service: one gRPC call per request.

The service's address comes from the dispatcher actor and changes when it restarts; a call that
finds the service gone is asked again (``retry`` set, same id, so the request never runs twice)
until the dispatcher is back or ``wait_s`` has passed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc

from common.rpc import fairgate_pb2 as pb
from common.rpc import fairgate_pb2_grpc as rpc
from dispatcher.admission_service import TOKEN_METADATA, ingress_token


class DispatcherUnavailable(Exception):
    """The dispatcher did not come back within the wait."""


class AdmissionClient:
    def __init__(self, address: Callable[[], Awaitable[str]], secret: str, wait_s: float) -> None:
        """``address``: asks the dispatcher actor where its service is (waits out a restart itself)."""
        self._address = address
        self._metadata = ((TOKEN_METADATA, ingress_token(secret.encode())),)
        self._wait_s = wait_s
        self._stub: rpc.AdmissionStub | None = None
        self._channel: grpc.aio.Channel | None = None
        self._connecting: asyncio.Task[rpc.AdmissionStub] | None = None

    async def submit(self, request: pb.SubmitRequest) -> pb.SubmitReply:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s
        delay = 0.1
        while True:
            stub = self._stub or await self._connect()
            try:
                return await stub.Submit(request, metadata=self._metadata)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                self._forget(stub)
            if loop.time() >= deadline:
                raise DispatcherUnavailable
            request.retry = True  # it may have been queued (or assigned) before the service went away
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)

    async def _connect(self) -> rpc.AdmissionStub:
        """One lookup for all the calls that need it at once."""
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.get_running_loop().create_task(self._open())
        return await asyncio.shield(self._connecting)

    async def _open(self) -> rpc.AdmissionStub:
        address = await self._address()
        # the previous channel is dropped, not closed: closing would cancel calls still waiting on it
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = rpc.AdmissionStub(self._channel)
        return self._stub

    def _forget(self, stub: rpc.AdmissionStub) -> None:
        """The service at the cached address is gone: the next call asks the actor again."""
        if self._stub is stub:
            self._stub = None

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
