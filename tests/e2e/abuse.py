"""What a hostile tenant sends: malformed bodies of every field kind, and requests it abandons at
every stage. Shared by the abuse tests against simulated and vLLM workers; they talk HTTP only, so
they keep guarding whatever the ingress does inside."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re

import httpx

DEEP = 5000  # levels of nesting: deeper than Python's recursion limit


def malformed_bodies(model: str) -> list[tuple[str, str, bytes]]:
    """(what, path, raw body) of requests that must each get a 4xx."""

    def body(path: str, **fields) -> tuple[str, bytes]:
        if path == "/completions":
            base = {"model": model, "prompt": "hi"}
        else:
            base = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        return path, json.dumps({**base, **fields}).encode()

    def raw(path: str, text: str) -> tuple[str, bytes]:
        return path, text.encode()

    cases: dict[str, tuple[str, bytes]] = {
        "max_tokens overflows int32": body("/completions", max_tokens=2**40),
        "max_tokens negative": body("/completions", max_tokens=-1),
        "max_tokens zero": body("/chat/completions", max_tokens=0),
        "max_tokens infinite": raw("/completions", f'{{"model": "{model}", "prompt": "hi", "max_tokens": 1e400}}'),
        "max_tokens a float": body("/completions", max_tokens=3.5),
        "max_tokens beyond the context": body("/completions", max_tokens=10**6),
        "max_completion_tokens overflows": body("/chat/completions", max_completion_tokens=2**33),
        "seed above 64 bits": body("/completions", seed=2**64 + 1),
        "seed far below": body("/chat/completions", seed=-(2**70)),
        "temperature NaN": raw("/completions", f'{{"model": "{model}", "prompt": "hi", "temperature": NaN}}'),
        "top_p Infinity": raw("/chat/completions", f'{{"model": "{model}", "messages": [], "top_p": Infinity}}'),
        "temperature out of range": body("/completions", temperature=7),
        "top_p zero": body("/completions", top_p=0),
        "temperature a word": body("/completions", temperature="hot"),
        "prompt a lone surrogate": raw("/completions", f'{{"model": "{model}", "prompt": "x\\ud800y"}}'),
        "stop a lone surrogate": raw("/completions", f'{{"model": "{model}", "prompt": "hi", "stop": ["\\udfff"]}}'),
        "message a lone surrogate": raw(
            "/chat/completions", f'{{"model": "{model}", "messages": [{{"role": "user", "content": "\\ud83d"}}]}}'
        ),
        "key a lone surrogate": raw("/completions", f'{{"model": "{model}", "prompt": "hi", "\\ud800": 1}}'),
        "deep nesting": raw("/completions", f'{{"model": "{model}", "prompt": "hi", "x": {"[" * DEEP}{"]" * DEEP}}}'),
        "deep objects": raw("/chat/completions", '{"a":' * DEEP + "1" + "}" * DEEP),
        "huge prompt list": body("/completions", prompt=["hi"] * 5000),
        "huge stop list": body("/completions", stop=["x"] * 2000),
        "prompt as token ids": body("/completions", prompt=[1, 2, 3]),
        "prompt as token id lists": body("/completions", prompt=[[1, 2], [3]]),
        "empty prompt": body("/completions", prompt=""),
        "empty prompt in a list": body("/completions", prompt=[""]),
        "no messages": body("/chat/completions", messages=[]),
        "messages a string": body("/chat/completions", messages="hello"),
        "unknown role": body("/chat/completions", messages=[{"role": "robot", "content": "hi"}]),
        "content an image": body(
            "/chat/completions", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]
        ),
        "stream a word": body("/completions", stream="yes"),
        "stream_options a number": body("/completions", stream_options=5),
        "n two": body("/completions", n=2),
        "n a word": body("/completions", n="two"),
        "model a list": body("/completions", model=["a"]),
        "unknown model": body("/completions", model="gpt-17"),
        "body a list": raw("/completions", "[1, 2, 3]"),
        "body a string": raw("/chat/completions", '"hello"'),
        "body null": raw("/completions", "null"),
        "body not UTF-8": ("/completions", b'{"model": "\xff\xfe"}'),
        "body not JSON": raw("/completions", "{model: fairgate}"),
        "body empty": raw("/chat/completions", ""),
    }
    return [(what, path, data) for what, (path, data) in cases.items()]


INTERNALS = re.compile(r"127\.0\.0\.1|localhost|\d+\.\d+\.\d+\.\d+:\d+|Traceback|Error\(|Exception|grpc|StatusCode")


async def send_malformed(base_url: str, key: str, model: str) -> list[tuple[str, int, str]]:
    """Every malformed body once; returns (what, status, body text)."""
    out = []
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:
        for what, path, data in malformed_bodies(model):
            r = await client.post(base_url + path, content=data)
            out.append((what, r.status_code, r.text))
    return out


async def abandon(base_url: str, key: str, model: str, streams: int = 12, calls: int = 6) -> None:
    """Requests the client gives up on at once: streams closed as soon as their headers arrive, and
    non-streaming calls cut off while queued or before their first token."""
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": model, "prompt": "word " * 20, "max_tokens": 400, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:

        async def one_stream() -> None:
            async with client.stream("POST", base_url + "/completions", json={**body, "stream": True}) as r:
                assert r.status_code == 200

        await asyncio.gather(*(one_stream() for _ in range(streams)))

    async with httpx.AsyncClient(timeout=httpx.Timeout(0.05), headers=headers) as hasty:

        async def one_call() -> None:
            with contextlib.suppress(httpx.TimeoutException):
                await hasty.post(base_url + "/completions", json=body)

        await asyncio.gather(*(one_call() for _ in range(calls)))
