"""Replay a workload straight into one engine runner, in real time, and measure what it generated.

Used to check the simulator against a real engine: the same workload (arrival times, exact prompt and
output lengths as token ids with ``ignore_eos``) goes to the runner with no gateway in front, and the
output tokens generated within the workload's duration are counted as they stream back. As behind the
dispatcher, at most the engine's batch limit is in the engine at once; the rest wait here, in order.
"""

from __future__ import annotations

import asyncio
import random
import time

from fairgate.loadgen.workload import Workload
from fairgate.workers.engines.interface import EngineRunner, GenerationParams


async def replay_into_runner(runner: EngineRunner, workload: Workload, vocabulary: range, seed: int = 0) -> float:
    """Output tokens per second generated during ``[0, workload.duration_s]``."""
    rng = random.Random(seed)
    start = time.monotonic()
    end = start + workload.duration_s
    counted = 0
    admitted = asyncio.Semaphore(runner.max_running or len(workload.requests) or 1)

    async def one(i: int, prompt: list[int], output: int) -> None:
        nonlocal counted
        seen = 0
        params = GenerationParams(prompt, max_tokens=output, ignore_eos=True, seed=i)
        async with admitted:
            async for delta in runner.generate(f"replay-{seed}-{i}", params):
                if time.monotonic() <= end:
                    counted += delta.completion_tokens - seen
                seen = delta.completion_tokens

    tasks = []
    for i, r in enumerate(workload.requests):
        delay = start + r.arrival_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        prompt = [rng.choice(vocabulary) for _ in range(r.prompt_tokens)]
        tasks.append(asyncio.create_task(one(i, prompt, r.output_tokens)))
    await asyncio.sleep(max(0.0, end - time.monotonic()))
    for task in tasks:
        task.cancel()  # what is still running past the duration is not measured
    await asyncio.gather(*tasks, return_exceptions=True)
    return counted / workload.duration_s
