"""The internal frame listeners against strangers (``common/frame_guard.py``), on real loopback TCP:
partial frames of tens of MiB before the hello, garbage, a wrong key with frames behind it, 1,500
connections that never say hello, and idle peers. The listener's memory stays within a few MiB and
comes back, deadlines close what they should, nothing a stranger sends is parsed, and a real peer is
served throughout. The listener is the admission endpoint (a fake dispatcher behind it)."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import threading

import pytest

from fairgate.common.frame_guard import ADMISSION_HOP, HELLO_FRAME_BYTES, Guard, HandshakeRefused, hello_for, hop_key
from fairgate.common.frames import ConnectionLost, FrameConnection, MessageConnection, connect, listen
from fairgate.common.rpc import fairgate_pb2 as pb

from ..waiting import eventually

SECRET = b"frame-guard-test-secret"
KEY = hop_key(SECRET, ADMISSION_HOP)
MiB = 1 << 20


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Counting(MessageConnection):
    """Answers each submit at once, and counts every message it parsed."""

    incoming = pb.AdmissionFrame
    parsed = 0

    def on_message(self, message: pb.AdmissionFrame) -> None:
        _Counting.parsed += 1
        self.start(message.submit.request_id, self._answer(message.submit.request_id))

    async def _answer(self, rid: str) -> None:
        self.send_message(pb.SubmitReply(request_id=rid))


async def _serve(guard: Guard) -> tuple[asyncio.Server, str, object]:
    _Counting.parsed = 0
    return await listen("127.0.0.1", lambda: _Counting(set()), guard)


async def _one_call(address: str, rid: str) -> str:
    """A real peer: a connection with the right key, one submit, its answer."""
    conn = await connect(address, FrameConnection, KEY)
    try:
        conn.send_message(pb.AdmissionFrame(submit=pb.SubmitRequest(request_id=rid)))
        return (await conn.next_message(pb.SubmitReply)).request_id
    finally:
        conn.abort()


def _stranger_sends_a_huge_partial_frame(address: str, claimed: int, results: list[int]) -> None:
    """A raw socket that reads the nonce, then claims a ``claimed``-byte frame and sends MiB after MiB
    of it (one reused buffer) until the listener hangs up; records the bytes the kernel took."""
    host, _, port = address.rpartition(":")
    chunk = bytes(MiB)
    sent = 0
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.recv(4 + 32)
        try:
            s.sendall(claimed.to_bytes(4, "big"))
            while sent < claimed:
                sent += s.send(chunk)
        except OSError:
            pass
    results.append(sent)


def test_partial_frames_of_tens_of_mib_before_the_hello_are_refused_at_their_header():
    async def scenario():
        server, address, gate = await _serve(Guard(KEY, max_frame_bytes=2 * MiB))
        before = rss_bytes()
        sent: list[int] = []
        threads = [
            threading.Thread(target=_stranger_sends_a_huge_partial_frame, args=(address, 48 * MiB, sent))
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            await asyncio.sleep(0.01)  # the listener runs on this loop meanwhile
            assert rss_bytes() - before < 8 * MiB
        assert await _one_call(address, "served") == "served"
        assert len(sent) == 4 and all(n < 48 * MiB for n in sent)  # hung up on long before the end
        await eventually(lambda: not len(gate))  # the served peer's connection ends
        assert rss_bytes() - before < 8 * MiB and _Counting.parsed == 1 and len(gate) == 0
        server.close()

    asyncio.run(scenario())


def test_a_wrong_hello_is_refused_and_nothing_sent_behind_it_is_parsed():
    """Garbage, and a hello under another key followed in the same write by a thousand well-formed
    submits: refused (a verdict naming why), closed, none of the submits parsed."""

    async def scenario():
        server, address, gate = await _serve(Guard(KEY, max_frame_bytes=2 * MiB))
        reader, writer = await asyncio.open_connection(*address.split(":"))
        nonce = (await reader.readexactly(4 + 32))[4:]
        submit = pb.AdmissionFrame(submit=pb.SubmitRequest(request_id="smuggled")).SerializeToString()
        frames = [hello_for(hop_key(b"another secret", ADMISSION_HOP), nonce)] + [submit] * 1000
        writer.write(b"".join(len(f).to_bytes(4, "big") + f for f in frames))
        verdict = await reader.read(1 << 16)
        assert b"refused" in verdict
        assert await reader.read() == b""  # then closed
        writer.close()
        garbage, writer = await asyncio.open_connection(*address.split(":"))
        await garbage.readexactly(4 + 32)
        writer.write(os.urandom(64))
        await garbage.read()
        writer.close()
        with pytest.raises(HandshakeRefused):
            conn = await connect(address, FrameConnection, hop_key(b"another secret", ADMISSION_HOP))
            await conn.next_frame()
        await asyncio.sleep(0.1)
        assert _Counting.parsed == 0 and gate.refused >= 3 and len(gate) == 0
        assert await _one_call(address, "served") == "served"
        server.close()

    asyncio.run(scenario())


def test_1500_connections_that_never_say_hello_are_closed_and_a_real_peer_gets_in():
    """A cap on connections waiting for their hello (the oldest make room) and the hello deadline
    close them all; the listener's memory comes back; a real peer connecting amid them is served."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))

    async def scenario():
        server, address, gate = await _serve(Guard(KEY, max_frame_bytes=2 * MiB, hello_s=1.0, max_unverified=256))
        host, port = address.split(":")
        before = rss_bytes()
        idle = []
        for i in range(1500):
            idle.append(await asyncio.open_connection(host, int(port)))
            if i == 750:
                assert await _one_call(address, "amid") == "amid"
        assert len(gate) <= 256
        await asyncio.sleep(1.5)  # past the hello deadline
        assert len(gate) == 0
        closed = 0
        for reader, writer in idle:
            data = await asyncio.wait_for(reader.read(), 5.0)  # the nonce, then the end
            closed += len(data) <= 4 + 32
            writer.close()
        assert closed == 1500
        assert rss_bytes() - before < 16 * MiB
        assert await _one_call(address, "after") == "after"
        server.close()

    asyncio.run(scenario())


def test_an_idle_peer_is_closed_after_the_idle_deadline_but_never_while_its_call_runs():
    class _Slow(_Counting):
        async def _answer(self, rid: str) -> None:
            await asyncio.sleep(0.8)
            self.send_message(pb.SubmitReply(request_id=rid))

    async def scenario():
        server, address, gate = await listen("127.0.0.1", lambda: _Slow(set()), Guard(KEY, 2 * MiB, idle_s=0.3))
        idle = await connect(address, FrameConnection, KEY)
        busy = await connect(address, FrameConnection, KEY)
        busy.send_message(pb.AdmissionFrame(submit=pb.SubmitRequest(request_id="slow")))
        assert (await busy.next_message(pb.SubmitReply)).request_id == "slow"  # 0.8 s: past the deadline
        with pytest.raises(ConnectionLost):
            await asyncio.wait_for(idle.next_frame(), 2.0)
        with pytest.raises(ConnectionLost):  # then idle itself
            await asyncio.wait_for(busy.next_frame(), 2.0)
        assert len(gate) == 0
        server.close()

    asyncio.run(scenario())


def test_a_verified_peers_frame_over_the_cap_closes_its_connection():
    async def scenario():
        server, address, _ = await _serve(Guard(KEY, max_frame_bytes=64 << 10))
        conn = await connect(address, FrameConnection, KEY)
        conn.send(b"x" * ((64 << 10) + 1))
        with pytest.raises(ConnectionLost):
            await asyncio.wait_for(conn.next_frame(), 2.0)
        assert _Counting.parsed == 0
        server.close()

    asyncio.run(scenario())


def test_before_the_hello_a_frame_over_a_few_kib_closes_the_connection():
    async def scenario():
        server, address, gate = await _serve(Guard(KEY, max_frame_bytes=2 * MiB))
        reader, writer = await asyncio.open_connection(*address.split(":"))
        await reader.readexactly(4 + 32)
        writer.write((HELLO_FRAME_BYTES + 1).to_bytes(4, "big"))
        assert await asyncio.wait_for(reader.read(), 2.0) == b""
        writer.close()
        assert len(gate) == 0
        server.close()

    asyncio.run(scenario())
