"""Waiting with a time limit without losing a cancel.

On Python 3.11, ``asyncio.wait_for`` returns the result when the caller is cancelled in the event-loop
turn that the awaited thing completes, and the cancel is gone: a request's connect whose client left
went on to wait for frames no one would send. ``within`` is ``wait_for`` with that cancel passed on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float) -> T:
    """``await awaitable``, ``TimeoutError`` after ``timeout_s``; a cancel of the caller always ends it."""
    result = await asyncio.wait_for(awaitable, timeout_s)
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
    return result
