"""The worker drives its engine's ASGI app in-process; a stream's pieces are joined at most once per
linger interval, and neither a piece after a quiet interval nor a stream's first text is held back."""

from __future__ import annotations

import asyncio
import json

from fairgate.workers.asgi_call import Linger, call_asgi
from fairgate.workers.stream_text import carries_text


def app_sending(pieces: int, gap_s: float):
    async def app(scope, receive, send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for i in range(pieces):
            if i and gap_s:
                await asyncio.sleep(gap_s)
            await send({"type": "http.response.body", "body": b"%d;" % i, "more_body": True})
            await asyncio.sleep(0)
        await send({"type": "http.response.body", "body": b"end", "more_body": False})

    return app


async def relay(pieces: int, gap_s: float, linger_s: float) -> list[tuple[bytes, float]]:
    loop = asyncio.get_running_loop()
    response = await call_asgi(app_sending(pieces, gap_s), "/", b"{}", {}, linger=Linger(linger_s))
    assert response.status == 200 and response.content_type == "text/plain"
    return [(piece, loop.time()) async for piece in response.body]


def test_fast_pieces_are_joined_and_every_byte_arrives_in_order():
    got = asyncio.run(relay(200, 0.0, 0.05))
    assert b"".join(p for p, _ in got) == b"".join(b"%d;" % i for i in range(200)) + b"end"
    assert len(got) < 20  # 201 sends, a handful of pieces


def test_a_piece_after_a_quiet_interval_is_not_held_back():
    # pieces 0.6 s apart, a 0.5 s linger: each goes as it comes (the old rule held each for 0.5 s)
    async def timed() -> tuple[list[tuple[bytes, float]], float]:
        start = asyncio.get_running_loop().time()
        return await relay(3, 0.6, 0.5), start

    got, start = asyncio.run(timed())
    assert [p for p, _ in got][:3] == [b"0;", b"1;", b"2;"]
    assert got[2][1] - start < 0.6 * 2 + 0.4  # the third left at about 1.2 s, not 2.2 s


def test_the_lingers_end_lets_held_bytes_go_at_once():
    # a long linger, ended while the second piece waits in it: that piece goes then, not after 5 s
    async def ended_early() -> tuple[list[tuple[bytes, float]], float]:
        loop = asyncio.get_running_loop()
        linger = Linger(5.0)
        response = await call_asgi(app_sending(3, 0.0), "/", b"{}", {}, linger=linger)
        start = loop.time()
        loop.call_later(0.2, linger.end)
        return [(piece, loop.time()) async for piece in response.body], start

    got, start = asyncio.run(ended_early())
    assert b"".join(p for p, _ in got) == b"0;1;2;end"
    assert got[-1][1] - start < 2.0  # held until the end at 0.2 s, then everything left went


def app_sending_events(events: list[bytes]):
    async def app(scope, receive, send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
            await asyncio.sleep(0)  # each read apart
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    return app


def chat_event(content: str | None, role: str | None = None) -> bytes:
    delta = {"content": content} if role is None else {"role": role, "content": content}
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}, separators=(",", ":")).encode() + b"\n\n"


def test_nothing_waits_until_the_first_generated_text_has_gone():
    # vLLM's chat sends its role's event, then the first token's, and a token may decode to no text yet:
    # each of those went at once, and the first text too (the linger held a light load's first token
    # 25 ms); the pieces after it are joined again
    head = [chat_event("", role="assistant"), chat_event(""), chat_event("")]
    tokens = [chat_event(f" t{i}") for i in range(30)]

    async def timed() -> tuple[list[tuple[bytes, float]], float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        response = await call_asgi(app_sending_events(head + tokens), "/", b"{}", {}, linger=Linger(5.0, carries_text))
        got = []
        async for piece in response.body:
            got.append((piece, loop.time()))
            if b" t0" in piece:
                break
        await response.body.aclose()
        return got, start

    got, start = asyncio.run(timed())
    assert b"".join(p for p, _ in got) == b"".join(head) + tokens[0]
    assert got[-1][1] - start < 1.0  # at once, not after the 5 s linger
    assert len(got) == len(head) + 1  # one piece each: none was held to join the next


def test_generated_text_is_told_from_events_that_carry_none():
    assert not carries_text(chat_event("", role="assistant"))
    assert not carries_text(chat_event(""))
    assert not carries_text(chat_event(None))
    assert carries_text(chat_event(" hello"))
    assert carries_text(b'data: {"choices": [{"text": "x", "index": 0}]}\n\n')  # completions, spaced JSON
    assert not carries_text(b'data: {"choices": [{"text": "", "index": 0}]}\n\n')
    tool = {"tool_calls": [{"index": 0, "function": {"name": "get_weather", "arguments": ""}}]}
    assert carries_text(b"data: " + json.dumps({"choices": [{"delta": tool}]}).encode())
