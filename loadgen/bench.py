"""``fairgate bench core``: scheduling decisions per second of the pure core.

A decision is one request's whole life in the dispatcher: submit, assign, one report charging its
output tokens, finish. Every tenant keeps a request waiting, so the least-served choice is made
among all of them (the heap holds every tenant).
"""

from __future__ import annotations

import random
import time

from dispatcher.core import FairScheduler, SchedulerConfig


def decisions_per_second(tenants: int, decisions: int, seed: int = 0, repeats: int = 3) -> float:
    """Best of ``repeats`` timed runs (the least disturbed by other work on the machine)."""
    return max(_one_run(tenants, decisions, seed + r) for r in range(repeats))


def _one_run(tenants: int, decisions: int, seed: int) -> float:
    sched = FairScheduler(SchedulerConfig(max_engine_waiting=1))
    sched.worker_join("w", kv_tokens=1 << 60)
    names = [f"t{i}" for i in range(tenants)]
    rng = random.Random(seed)
    for i, name in enumerate(names):  # everyone backlogged before the clock starts
        sched.submit(f"pre{i}", name, 64, 32, 0.0)
    picks = [names[rng.randrange(tenants)] for _ in range(decisions)]
    submit, assign, report, finish = sched.submit, sched.assign, sched.on_report, sched.on_finish
    start = time.perf_counter()
    for i, name in enumerate(picks):
        now = float(i)
        submit(str(i), name, 64, 32, now)
        for a in assign(now):
            rid = a.request.id
            report("w", {rid: 32}, started={rid: 64}, running=0, waiting=0)
            finish(rid, 32, "stop", now)
    elapsed = time.perf_counter() - start
    return decisions / elapsed


def bench_core(tenant_counts: list[int], decisions: int) -> list[tuple[int, float]]:
    return [(n, decisions_per_second(n, decisions)) for n in tenant_counts]
