"""Measure a vLLM engine's prefill and decode times by length, in the format of the shared cost profile
(``{input: {output: [batch, prefill_s, decode_s]}}``): for each (input, output) pair, the largest batch
that fits the KV pool (and vLLM's batch limit) is started at once; prefill is the time until every
request has its first token, decode the time from there until the last one finishes, both divided by
the batch, i.e. per-request seconds. The simulated engine's step-time model and the profiled cost
function both fit themselves to such a profile.

Prompts are random token ids (distinct per request, so prefix caching cannot shorten prefill).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable

from fairgate.workers.engines.interface import GenerationParams
from fairgate.workers.engines.vllm.local_models import SPECIAL_TOKENS, VOCAB_SIZE
from fairgate.workers.engines.vllm.runner import VllmRunner

Profile = dict[str, dict[str, list[float]]]


def largest_batch(runner: VllmRunner, prompt: int, output: int) -> int:
    blocks = -(-(prompt + output) // runner.block_size)
    fits = runner.kv_tokens // (blocks * runner.block_size)
    return max(0, min(fits, runner.max_running or fits))


async def measure(runner: VllmRunner, prompt: int, output: int, batch: int, rng: random.Random) -> list[float]:
    """One batch: [batch, prefill seconds per request, decode seconds per request]."""
    first_token: dict[int, float] = {}
    prompts = [[rng.randrange(len(SPECIAL_TOKENS), VOCAB_SIZE) for _ in range(prompt)] for _ in range(batch)]
    tag = rng.getrandbits(32)

    async def one(i: int) -> None:
        params = GenerationParams(prompts[i], max_tokens=output, ignore_eos=True, seed=i)
        async for delta in runner.generate(f"profile-{tag}-{i}", params):
            if delta.completion_tokens and i not in first_token:
                first_token[i] = time.perf_counter()

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(batch)))
    end = time.perf_counter()
    prefilled = max(first_token.values(), default=end)
    return [batch, (prefilled - start) / batch, (end - prefilled) / batch]


async def profile(
    runner: VllmRunner,
    inputs: Iterable[int],
    outputs: Iterable[int],
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> Profile:
    rng = random.Random(seed)
    await measure(runner, 16, 8, 4, rng)  # warm-up: first batches pay one-off costs
    result: Profile = {}
    for x in inputs:
        for y in outputs:
            batch = largest_batch(runner, x, y)
            if batch < 1:
                continue
            result.setdefault(str(x), {})[str(y)] = row = await measure(runner, x, y, batch, rng)
            if progress is not None:
                progress(f"input {x:>5} output {y:>5}: batch {batch:>4}, prefill {row[1]:.5f} s, decode {row[2]:.5f} s")
    return result


def average_profiles(*profiles: Profile) -> Profile:
    """The mean of several measurements of the same grid (a noisy machine measured more than once)."""
    out: Profile = {}
    for x, by_output in profiles[0].items():
        for y in by_output:
            rows = [p[x][y] for p in profiles if y in p.get(x, {})]
            out.setdefault(x, {})[y] = [min(r[0] for r in rows)] + [sum(r[i] for r in rows) / len(rows) for i in (1, 2)]
    return out
