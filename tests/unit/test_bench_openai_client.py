"""The benchmark client's closed loops: every call made once, and each failure counted by what failed
(an HTTP status, or the client's exception), so a stray error in a run can be told apart."""

from __future__ import annotations

import asyncio
import collections

import httpx

from loadgen.bench_openai import _closed_loops


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
    results, errors, seconds = asyncio.run(_closed_loops(3, 35, one, kinds))
    assert calls == 35 and len(results) + errors == 35 and seconds >= 0
    assert kinds == {"RemoteProtocolError": 7, "HTTP 503": 4}  # 35 is counted as a protocol error
    assert errors == 11
