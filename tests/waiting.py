"""Waiting on what another task or process does, bounded by time rather than by a count of polls (a
loaded host runs a count of polls out long before the thing awaited is late)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def eventually(condition: Callable[[], object], timeout_s: float = 30.0, every_s: float = 0.01) -> bool:
    """Whether ``condition()`` held within ``timeout_s``; it returns as soon as it does."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(every_s)
    return True
