"""What the scheduler shows of itself, computed from its parts: who waits, the bound and the gaps it is
checked against, the autoscaler's demand, and stats for the live page. Reads only."""

from __future__ import annotations

from typing import Any

from fairgate.core.capacity import Demand
from fairgate.core.fairness import engine_queue_slack, in_flight_reach, unit_u
from fairgate.core.policies import FairnessPolicy
from fairgate.core.scheduler_config import SchedulerConfig
from fairgate.core.tenant_book import TenantBook
from fairgate.core.tree import TenantTree
from fairgate.core.workers import WorkerTable


def waiting_tenants(book: TenantBook) -> list[str]:
    """Tenants (leaves) with waiting requests."""
    tree = book.tree
    if not tree.nodes and not tree.strict.kids:
        return list(tree.root.waiting)
    return [t.name for t in book.tenants.values() if t.queue]


def sibling_gaps(tree: TenantTree) -> dict[str, float]:
    """Per tree node ("": the root), the largest counter gap between its backlogged children: siblings
    are what the bound compares (counters of different parents are not comparable)."""
    gaps: dict[str, float] = {}
    for node in (tree.root, *tree.nodes.values()):
        entries = node.waiting.entries()
        if len(entries) < 2:
            continue
        counters = [node.kids[name].counter for name, _ in entries]
        gaps[node.name] = max(counters) - min(counters)
    return gaps


def bound_for(
    policy: FairnessPolicy, config: SchedulerConfig, longest_prompt: int, longest_output: int, pool: int, engines: int
) -> float:
    """The stated bound for requests of these sizes on ``engines`` engines of ``pool`` KV tokens in all:
    the policy's own (2U + Δ with locality slack), else VTC's 2U, plus what the engines' queues can add."""
    u = unit_u(config.cost, longest_prompt, longest_output, in_flight_reach(pool, config.overcommit))
    stated = policy.bound(u)
    queued = config.max_engine_waiting * engines
    return (2.0 * u if stated is None else stated) + engine_queue_slack(config.cost, longest_prompt, queued)


def demand(book: TenantBook, queued: int, running: int, workers: WorkerTable) -> Demand:
    """Running and waiting load against the workers taking work (the autoscaler's input)."""
    slots = workers.slots.values()
    active = workers.taking_work
    limits = [w.max_running for w in active if w.max_running]
    return Demand(
        queued_requests=queued,
        queued_tokens=sum(t.queued_tokens for t in book.tenants.values() if t.queue),
        running_requests=running,
        committed_tokens=sum(max(0, w.kv_tokens - w.free_tokens) + w.pending_tokens for w in slots),
        workers=len(active),
        pool_tokens=sum(w.kv_tokens for w in active) // len(active) if active else 0,
        max_running=min(limits) if limits else 0,
    )


def stats(book: TenantBook, queued: int, running: int, workers: WorkerTable) -> dict[str, Any]:
    """Every tenant's and tree node's figures, the queue and the workers (the live page's)."""
    return {
        **tenant_stats(book),
        "queue_depth": queued,
        "in_flight": running,
        "workers": workers.snapshot(),
    }


def tenant_stats(book: TenantBook) -> dict[str, Any]:
    """Every tenant's and tree node's figures: ``stats`` less the workers, so its work does not grow
    with the fleet (what is sampled every second)."""
    return {
        "tenants": {
            t.name: {
                "weight": t.weight,
                "counter": t.counter,
                "service": t.service,
                "lifted": t.lifted,
                "queued": len(t.queue),
                "queued_tokens": t.queued_tokens,
                "in_flight": t.in_flight,
                "submitted": t.submitted,
                "rejected": t.rejected,
                "revoked": t.revoked,
                "finished": t.finished,
                "output_tokens": t.output_tokens,
                "prompt_tokens": t.prompt_tokens,
                "cached_tokens": t.cached_tokens,
                "parent": t.parent,
            }
            for t in book.tenants.values()
        },
        "nodes": {
            n.name: {
                "weight": n.weight,
                "parent": n.parent,
                "counter": n.counter,
                "service": n.service,
                "waiting": len(n.waiting) > 0,
                "implicit": n.implicit,
            }
            for n in book.tree.nodes.values()
        },
    }
