"""A scheduler as data, and back: whole snapshots (experiments, tests) and the durable state a restarted
dispatcher continues from (written to Redis every second).

A snapshot holds every table, so a restored scheduler makes exactly the decisions the original would
have made. The durable state holds only what cannot come back from elsewhere: counters, the last
tenant to leave the waiting set, the policy's own state and what each running request was charged.
After a restart the waiting requests come back from their callers and the running ones from their
workers (``FairScheduler.adopt``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from fairgate.core.continuations import Continuations
from fairgate.core.costs import CostFunction
from fairgate.core.ledger import Ledger
from fairgate.core.model import Tenant, request_from_dict
from fairgate.core.openings import BudgetUse
from fairgate.core.policies import FairnessPolicy
from fairgate.core.predictors import MovingAveragePredictor
from fairgate.core.prefix_index import PrefixIndex
from fairgate.core.scheduler_config import SchedulerConfig
from fairgate.core.scheduler_state import SchedulerState
from fairgate.core.tree import TenantTree, TreeNode
from fairgate.core.workers import WorkerTable


class Snapshottable(Protocol):
    """The parts of a scheduler a snapshot is made of: its settings, its own record, and the tables of
    its parts (each of which snapshots and restores itself)."""

    config: SchedulerConfig
    cost: CostFunction
    state: SchedulerState
    tree: TenantTree
    workers: WorkerTable
    policy: FairnessPolicy
    prefixes: PrefixIndex
    continuations: Continuations
    lengths: MovingAveragePredictor
    budget: BudgetUse
    urgent_waiting: dict[str, Tenant]
    revoking: dict[str, str]

    def waiting_tenants(self) -> list[str]: ...


SNAPSHOT_VERSION = 3
DURABLE_VERSION = 3
_DURABLE_FIELDS = (
    "name",
    "weight",
    "lifted",
    "submitted",
    "rejected",
    "revoked",
    "finished",
    "output_tokens",
    "prompt_tokens",
    "cached_tokens",
    "parent",
)


def snapshot(s: Snapshottable) -> dict[str, Any]:
    """Everything needed to continue exactly where ``s`` is, as JSON-able data."""
    state = s.state
    return {
        "version": SNAPSHOT_VERSION,
        "config": s.config.to_dict(),
        "tenants": [t.state() for t in state.tenants.values()],
        "in_flight": [r.to_dict() for r in state.in_flight.values()],
        "tree": s.tree.snapshot(),
        "next_seq": state.next_seq,
        "longest": state.longest(),
        "workers": s.workers.snapshot(),
        "policy": s.policy.snapshot(),
        "settled": state.settled_rows(),
        "resumed": sorted(state.resumed),
        "prefixes": s.prefixes.snapshot(),
        "next_homing": s.continuations.next_homing,
        "lengths": s.lengths.snapshot(),
        "budget": s.budget.snapshot(),
        "revoking": dict(s.revoking),
    }


def check_snapshot(data: Mapping[str, Any]) -> SchedulerConfig:
    """The settings a scheduler restored from ``data`` must be built with (its version checked)."""
    if data.get("version") != SNAPSHOT_VERSION:
        raise ValueError(f"unsupported snapshot version {data.get('version')!r}")
    return SchedulerConfig.from_dict(data["config"])


def restore_snapshot(s: Snapshottable, data: Mapping[str, Any]) -> None:
    """Continue exactly where ``snapshot`` was taken, on a fresh scheduler built with ``check_snapshot``'s
    settings."""
    state = s.state
    s.tree.restore_nodes(data["tree"]["nodes"])
    for row in data["tenants"]:
        t = Tenant.from_state(row)
        s.tree.attach(t, t.parent)
        state.tenants[t.name] = t
    state.index_queues()
    s.urgent_waiting = {t.name: t for t in state.tenants.values() if any(r.urgent for r in t.queue)}
    state.in_flight = {r["id"]: request_from_dict(r) for r in data["in_flight"]}
    s.revoking = dict(data.get("revoking", {}))
    s.tree.restore_waiting(data["tree"])
    state.next_seq = int(data["next_seq"])
    state.restore_longest(data["longest"])
    s.workers.restore(data["workers"])
    s.policy.restore(data["policy"])
    if data.get("lengths"):
        s.lengths.restore(dict(data["lengths"]))
    if data.get("budget"):
        s.budget.restore(dict(data["budget"]))
    state.restore_settled(data["settled"])
    state.resumed = set(data.get("resumed", ()))
    s.prefixes.restore(data.get("prefixes", {}))
    s.continuations.rebuild((t.queue for t in state.tenants.values()), int(data.get("next_homing", 1)))
    if s.config.max_queue_s is not None:
        state.index_arrivals()


def durable_state(s: Snapshottable, saved_at: float | None = None) -> dict[str, Any]:
    """What a restarted dispatcher needs to continue fairly. An assignment that has not started is
    written as if refunded: after the restart it starts (and is adopted) or is submitted again.
    ``saved_at``: now, on the clock its tickets' expiries are read from."""
    nodes = {
        n.name: TreeNode(n.name, n.weight, n.parent, n.counter, n.service, n.lifted, n.implicit)
        for n in s.tree.nodes.values()
    }
    state = s.state
    books = {t.name: Tenant(t.name, t.weight, t.counter, t.service, t.lifted) for t in state.tenants.values()}
    for t in state.tenants.values():
        books[t.name].ancestors = tuple(nodes[a.name] for a in t.ancestors)
    ledger = Ledger(s.cost, nodes)  # refunds on the copies
    for r in state.in_flight.values():
        if not r.started:
            move = ((r.prompt_tokens, 0), None), ((r.prompt_tokens, r.charged_output), None)
            ledger.account(books[r.tenant], *move, r.weight, r.path)
            ledger.account_cached(books[r.tenant], r.cached, 0, r.weight, r.path)
    rows = []
    for t in state.tenants.values():
        kept = books[t.name]
        rows.append({**{k: getattr(t, k) for k in _DURABLE_FIELDS}, "counter": kept.counter, "service": kept.service})
    tree_order = {n.name: i for i, n in enumerate(s.tree.snapshot_order())}
    return {
        "version": DURABLE_VERSION,
        "tenants": rows,
        "nodes": [n.row() for n in sorted(nodes.values(), key=lambda n: tree_order[n.name])],
        "charged": [
            [r.id, r.prompt_tokens, r.output_tokens, r.charged_output, r.weight, [list(p) for p in r.path]]
            for r in state.in_flight.values()
            if r.started
        ]
        + state.settled_rows(),
        "next_seq": state.next_seq,
        "last_left": s.tree.root.last_left,
        "waiting_nodes": sorted(set(s.tree.waiting_nodes()) | s.tree.resumed | _nodes_of_unstarted(s)),
        # who was waiting (or assigned, not started: it comes back to its queue): they keep their
        # counters when their callers ask again, as if they had never stopped waiting
        "waiting": sorted(
            {*s.waiting_tenants(), *(r.tenant for r in state.in_flight.values() if not r.started)} | state.resumed
        ),
        "longest": state.longest(),
        "policy": s.policy.snapshot(),
        "lengths": s.lengths.snapshot(),
        "budget": s.budget.snapshot(),
        "saved_at": saved_at,
        # written as refunded above: one that starts and ends before the restart is in no saved counter
        "unstarted": sorted(r.id for r in state.in_flight.values() if not r.started),
    }


def restore_durable(s: Snapshottable, data: Mapping[str, Any], now: float | None = None) -> None:
    """Continue from ``durable_state`` (on a fresh scheduler, before any request or worker); ``now``:
    when, on the clock the state's ``saved_at`` was read from."""
    if data.get("version") not in (1, 2, DURABLE_VERSION):  # 1: no waiting set recorded; 2: no tree
        raise ValueError(f"unsupported state version {data.get('version')!r}")
    state = s.state
    if not state.is_empty():
        raise ValueError("restore_durable needs a scheduler with nothing queued or in flight")
    s.tree.restore_nodes(data.get("nodes", ()))
    for row in data["tenants"]:
        t = Tenant.from_state({**row, "queue": [], "in_flight": 0})
        s.tree.attach(t, t.parent)
        state.tenants[t.name] = t
    state.restore_settled(data["charged"])
    state.next_seq = int(data["next_seq"])
    last = data["last_left"]
    s.tree.root.last_left = last if last in s.tree.root.kids else None
    s.tree.resumed = {name for name in data.get("waiting_nodes", ()) if name in s.tree.nodes}
    state.resumed = {name for name in data.get("waiting", ()) if name in state.tenants}
    state.restore_longest(data.get("longest", (0, 0)))
    s.policy.restore(data.get("policy", data.get("predictor", {})))  # "predictor": older states
    if data.get("lengths"):
        s.lengths.restore(dict(data["lengths"]))
    if data.get("budget"):
        s.budget.restore(dict(data["budget"]))
    if data.get("saved_at") is not None and now is not None:
        state.unsaved = (float(data["saved_at"]), now)
    state.unstarted_at_save = set(data.get("unstarted", ()))


def _nodes_of_unstarted(s: Snapshottable) -> set[str]:
    """The nodes above requests assigned but not started: they come back to their queues."""
    state = s.state
    return {a.name for r in state.in_flight.values() if not r.started for a in state.tenants[r.tenant].ancestors}
