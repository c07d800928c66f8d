"""A flood of random API keys, run as its own process (``python -m tests.e2e.key_flood HOST:PORT RATE
SECONDS``): keep-alive connections each sending ``POST /v1/chat/completions`` with a fresh random
bearer key, paced to RATE requests a second in all. Prints one JSON line: requests sent, answers by
status, and the rate reached."""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import time
from collections import Counter

CONNECTIONS = 64
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


def request_bytes(host: str) -> bytes:
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer sk-{secrets.token_hex(16)}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
    )
    return head.encode() + BODY


async def read_status(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """One response's status, and whether the server keeps the connection open."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers.get("connection", "").lower() != "close"


async def one_connection(address: str, interval: float, until: float, statuses: Counter) -> None:
    host, _, port = address.rpartition(":")
    reader = writer = None
    next_at = time.monotonic()
    while time.monotonic() < until:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(request_bytes(address))
            status, keep = await read_status(reader)
            statuses[status] += 1
            if not keep:
                writer.close()
                writer = None
        except (OSError, asyncio.IncompleteReadError):
            statuses["error"] += 1
            writer = None
            await asyncio.sleep(0.05)
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            next_at = time.monotonic()  # behind: as fast as the server answers
    if writer is not None:
        writer.close()


async def flood(address: str, rate: float, seconds: float) -> dict[str, object]:
    statuses: Counter = Counter()
    start = time.monotonic()
    until = start + seconds
    interval = CONNECTIONS / rate
    await asyncio.gather(*(one_connection(address, interval, until, statuses) for _ in range(CONNECTIONS)))
    elapsed = time.monotonic() - start
    sent = sum(statuses.values())
    return {"sent": sent, "statuses": {str(k): v for k, v in statuses.items()}, "rate": sent / elapsed}


if __name__ == "__main__":
    address, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    print(json.dumps(asyncio.run(flood(address, rate, seconds))))
