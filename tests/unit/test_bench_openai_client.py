"""The benchmark client: its closed loops make every call once and count each failure by what failed
(an HTTP status, or the client's exception); its event reader splits a stream at line feeds only."""

from __future__ import annotations

import asyncio
import collections
import json

import httpx

from fairgate.loadgen.benches.openai import closed_loops, sse_data


def test_closed_loops_make_every_call_and_count_failures_by_kind():
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    calls = 0

    async def one() -> int:
        nonlocal calls
        calls += 1
        number = calls
        await asyncio.sleep(0)  # the loops interleave
        if number % 5 == 0:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        if number % 7 == 0:
            response = httpx.Response(503, request=request)
            raise httpx.HTTPStatusError("busy", request=request, response=response)
        return number

    kinds: collections.Counter[str] = collections.Counter()
    results, errors, seconds = asyncio.run(closed_loops(3, 35, one, kinds))
    assert calls == 35 and len(results) + errors == 35 and seconds >= 0
    assert kinds == {"RemoteProtocolError": 7, "HTTP 503": 4}  # 35 is counted as a protocol error
    assert errors == 11


def test_sse_events_are_split_at_line_feeds_only():
    # generated text may hold U+2028 or U+0085 unescaped in an event's JSON: one event all the same
    text = "a\u2028b\x85c"
    events = [json.dumps({"choices": [{"delta": {"content": text}}]}, ensure_ascii=False), "[DONE]"]
    stream = "".join(f"data: {e}\n\n" for e in events).encode()

    async def pieces():
        for i in range(0, len(stream), 7):  # cut anywhere, even inside a character
            yield stream[i : i + 7]

    async def collect() -> list[bytes]:
        return [data async for data in sse_data(pieces())]

    got = asyncio.run(collect())
    assert got == [events[0].encode(), b"[DONE]"]
    assert json.loads(got[0])["choices"][0]["delta"]["content"] == text
