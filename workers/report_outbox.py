"""The messages on their way to the dispatcher over one stream, numbered as they are put.

A request's last bytes go to its client only once the dispatcher has acknowledged the report of its
end: a worker lost right after its client got a whole answer must not leave that answer's tokens
uncharged (the dispatcher would take the request for one that never started, and refund it when its
ticket expired). Written to the stream is not enough: a message gRPC has taken may still be in the
process when its node is lost (a node-loss test found 15 tokens uncharged so)."""

from __future__ import annotations

import asyncio
import contextlib

from fairgate.common.rpc import fairgate_pb2 as pb
from fairgate.common.waits import within


class ReportOutbox:
    """A queue of worker messages that knows how many of them were written. Positions count from 1 in
    the order messages are put; the stream's writer says when what it took has been written."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        self._put = 0
        self._taken = 0
        self._acked = 0
        self._closed = False
        self._progress = asyncio.Event()

    def put_nowait(self, message: pb.WorkerMessage | None) -> int:
        """Queue ``message`` (None: the stream's end); returns its position."""
        self._queue.put_nowait(message)
        self._put += 1
        return self._put

    async def get(self) -> pb.WorkerMessage | None:
        message = await self._queue.get()
        self._taken += 1
        return message

    def get_nowait(self) -> pb.WorkerMessage | None:
        message = self._queue.get_nowait()
        self._taken += 1
        return message

    def empty(self) -> bool:
        return self._queue.empty()

    def sending(self, held: int = 0) -> int:
        """The position up to which the message being sent now carries what was put (``held``
        messages taken and kept for the next one): what its acknowledgement will cover."""
        return self._taken - held

    def acked(self, position: int) -> None:
        """The dispatcher has applied every message up to ``position``."""
        self._acked = max(self._acked, position)
        self._wake()

    def close(self) -> None:
        """The stream is gone: what it did not write never will be (a new stream's hello re-announces
        what runs and what ended), so no one waits on it any longer."""
        self._closed = True
        self._queue.put_nowait(None)
        self._wake()

    async def until_acked(self, position: int, timeout_s: float) -> None:
        """Until the dispatcher has applied the message at ``position``, the stream is closed, or
        ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._acked < position and not self._closed:
            left = deadline - loop.time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await within(self._progress.wait(), left)

    def _wake(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()
