"""``fairgate bench core``: scheduling decisions per second of the pure core.

A decision is one request's whole life in the dispatcher: submit, assign, one report charging its
output tokens, finish. Requests arrive for random tenants while a fixed number stays queued, so each
decision picks the least-served among the waiting tenants. Two backlogs are measured:

- ``queued``: a fixed 1,000 requests wait, spread over the tenants (a loaded gateway);
- ``all``: every tenant keeps requests waiting (the worst case: the waiting set holds every tenant).
"""

from __future__ import annotations

import random
import time

from dispatcher.core import FairScheduler, SchedulerConfig

QUEUED = 1_000


def decisions_per_second(tenants: int, decisions: int, backlog: int, seed: int = 0) -> float:
    """Time ``decisions`` decisions with ``backlog`` requests kept waiting across ``tenants``."""
    sched = FairScheduler(SchedulerConfig(max_engine_waiting=1))
    sched.worker_join("w", kv_tokens=1 << 60)
    names = [f"t{i}" for i in range(tenants)]
    for name in names:
        sched.add_tenant(name)
    rng = random.Random(seed)
    for i in range(backlog):
        name = names[i] if backlog >= tenants and i < tenants else names[rng.randrange(tenants)]
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
    return decisions / (time.perf_counter() - start)


def bench_core(tenant_counts: list[int], decisions: int, rounds: int = 5) -> list[tuple[int, float, float]]:
    """(tenants, decisions/s with 1,000 queued, decisions/s with every tenant waiting), best of
    ``rounds``; the cases take turns within each round, so a slow moment of a noisy machine does not
    fall on one case only."""
    best = {(n, mode): 0.0 for n in tenant_counts for mode in ("queued", "all")}
    for r in range(rounds):
        for n in tenant_counts:
            best[(n, "queued")] = max(best[(n, "queued")], decisions_per_second(n, decisions, QUEUED, r))
            best[(n, "all")] = max(best[(n, "all")], decisions_per_second(n, decisions, n, r))
    return [(n, best[(n, "queued")], best[(n, "all")]) for n in tenant_counts]
