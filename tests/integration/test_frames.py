"""Length-prefixed frames on real loopback TCP connections (``common/frames.py``)."""

from __future__ import annotations

import asyncio

import pytest

from fairgate.common.frame_guard import Guard
from fairgate.common.frames import ConnectionLost, FrameConnection, MessageConnection, connect, listen
from fairgate.common.rpc import fairgate_pb2 as pb

KEY = b"k" * 32
GUARD = Guard(KEY, max_frame_bytes=1 << 20)


async def _pair() -> tuple[FrameConnection, FrameConnection, asyncio.Server]:
    accepted: asyncio.Queue[FrameConnection] = asyncio.Queue()

    def server_side() -> FrameConnection:
        conn = FrameConnection()
        accepted.put_nowait(conn)
        return conn

    server, address, _ = await listen("127.0.0.1", server_side, GUARD)
    client = await connect(address, FrameConnection, KEY)
    return client, await accepted.get(), server


def test_frames_arrive_whole_and_in_order_however_the_bytes_are_cut():
    async def scenario():
        client, server_conn, server = await _pair()
        frames = [b"", b"x", bytes(range(256)) * 300, b"last"]
        for f in frames:
            client.send(f)
        assert [await server_conn.next_frame() for _ in frames] == frames
        # the same frames fed byte by byte, as a slow network would cut them
        raw = b"".join(len(f).to_bytes(4, "big") + f for f in frames)
        receiver = FrameConnection()
        for i in range(len(raw)):
            receiver.data_received(raw[i : i + 1])
        assert [await receiver.next_frame() for _ in frames] == frames
        client.close()
        with pytest.raises(ConnectionLost):  # the peer closed: nothing more comes
            await server_conn.next_frame()
        server.close()

    asyncio.run(scenario())


def test_frames_of_one_turn_go_in_one_write_and_close_sends_them_first():
    async def scenario():
        client, server_conn, server = await _pair()
        writes: list[bytes] = []
        real_write = client.transport.write
        client.transport.write = lambda data: (writes.append(data), real_write(data))  # type: ignore[method-assign]
        for i in range(5):
            client.send(f"reply {i}".encode())
        client.close()  # right after sending: the frames still go, then the connection closes
        assert [await server_conn.next_frame() for _ in range(5)] == [f"reply {i}".encode() for i in range(5)]
        assert len(writes) == 1
        with pytest.raises(ConnectionLost):
            await server_conn.next_frame()
        server.close()

    asyncio.run(scenario())


def test_a_frame_longer_than_the_guards_limit_closes_the_connection():
    async def scenario():
        client, server_conn, server = await _pair()
        client.transport.write((GUARD.max_frame_bytes + 1).to_bytes(4, "big") + b"xx")
        with pytest.raises(ConnectionLost):
            await server_conn.next_frame()
        await asyncio.sleep(0.05)
        assert client.closed  # the peer hung up on it
        server.close()

    asyncio.run(scenario())


def test_drain_waits_while_the_peer_does_not_read():
    async def scenario():
        client, server_conn, server = await _pair()
        server_conn.transport.pause_reading()  # a slow reader
        client.transport.set_write_buffer_limits(high=64 * 1024)
        chunk = b"y" * 65536
        drained = 0

        async def writer() -> None:
            nonlocal drained
            for _ in range(200):
                client.send(chunk)
                await client.drain()
                drained += 1

        task = asyncio.create_task(writer())
        await asyncio.sleep(0.3)
        assert drained < 200  # held back: the kernel's buffers and ours are full
        server_conn.transport.resume_reading()
        for _ in range(200):
            assert await server_conn.next_frame() == chunk
        await task
        assert drained == 200
        client.close()
        server.close()

    asyncio.run(scenario())


STARTED: list[str] = []
CANCELLED: list[str] = []


async def _until(done, tries: int = 200) -> None:
    for _ in range(tries):
        if done():
            return
        await asyncio.sleep(0.01)


class _Echo(MessageConnection):
    """Answers each SubmitRequest at once (its id as the key), or never for tenant ``forever``."""

    incoming = pb.SubmitRequest

    def on_message(self, request: pb.SubmitRequest) -> None:
        self.start(request.request_id, self._answer(request))

    async def _answer(self, request: pb.SubmitRequest) -> None:
        STARTED.append(request.request_id)
        try:
            await asyncio.sleep(3600 if request.tenant == "forever" else 0.01)
        except asyncio.CancelledError:
            CANCELLED.append(request.request_id)
            raise
        self.send_message(pb.SubmitReply(request_id=request.request_id))


def test_message_connections_parse_track_their_calls_and_cancel_them_when_the_peer_leaves():
    """Both hops' message layer: replies come back as messages; a call asked again under its key
    replaces the first; every call still running is cancelled when the peer goes, and the connection
    leaves its server's registry; a frame that does not parse ends the connection."""

    async def scenario():
        registry: set[_Echo] = set()
        server, address, _ = await listen("127.0.0.1", lambda: _Echo(registry), GUARD)
        client = await connect(address, FrameConnection, KEY)
        client.send_message(pb.SubmitRequest(request_id="a"))
        assert (await client.next_message(pb.SubmitReply)).request_id == "a"
        (conn,) = registry
        client.send_message(pb.SubmitRequest(request_id="b", tenant="forever"))
        await _until(lambda: STARTED == ["a", "b"])
        client.send_message(pb.SubmitRequest(request_id="b", tenant="forever"))  # asked again: replaces
        client.send_message(pb.SubmitRequest(request_id="c", tenant="forever"))
        await _until(lambda: len(STARTED) == 4)
        assert CANCELLED == ["b"] and set(conn.calls) == {"b", "c"} and conn.busy()
        client.close()
        await _until(lambda: not registry)
        assert not registry and sorted(CANCELLED) == ["b", "b", "c"] and not conn.calls
        other = await connect(address, FrameConnection, KEY)
        other.send(b"\xff\xff not a message")
        with pytest.raises(ConnectionLost):
            await other.next_frame()
        server.close()

    asyncio.run(scenario())


def test_nothing_received_after_close_is_delivered():
    """A side that closes (a refusal) reads nothing more, not even frames already in the same read."""
    delivered: list[bytes] = []
    conn = FrameConnection(on_frame=lambda frame: (delivered.append(frame), conn.close()))
    conn.data_received(b"".join(len(f).to_bytes(4, "big") + f for f in (b"first", b"second", b"third")))
    conn.data_received((5).to_bytes(4, "big") + b"later")
    assert delivered == [b"first"]


def test_a_caller_cancelled_as_its_handshake_completes_is_cancelled():
    """The ingress cancels a request's connect when its client goes away; a cancel that lands in the
    same turn as the listener's handshake must still end the connect (asyncio.wait_for on 3.11 returned
    the connection instead, and the caller went on to wait for frames no one would send)."""

    async def scenario():
        connecting = asyncio.current_task()
        assert connecting is not None

        class CancelledOnHandshake(FrameConnection):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                super().connection_made(transport)
                assert self.handshake is not None
                self.handshake.ready.add_done_callback(lambda _: connecting.cancel())

        server, address, _ = await listen("127.0.0.1", FrameConnection, GUARD)
        with pytest.raises(asyncio.CancelledError):
            await connect(address, CancelledOnHandshake, KEY)
        server.close()

    asyncio.run(scenario())
