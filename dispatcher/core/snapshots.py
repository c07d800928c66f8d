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
from typing import TYPE_CHECKING, Any

from dispatcher.core.ledger import Ledger
from dispatcher.core.model import Tenant, request_from_dict
from dispatcher.core.tree import TreeNode

if TYPE_CHECKING:
    from dispatcher.core.scheduler import FairScheduler, Settled

SNAPSHOT_VERSION = 3
DURABLE_VERSION = 3
_DURABLE_FIELDS = (
    "name",
    "weight",
    "lifted",
    "submitted",
    "rejected",
    "finished",
    "output_tokens",
    "prompt_tokens",
    "cached_tokens",
    "parent",
)


def snapshot(s: FairScheduler) -> dict[str, Any]:
    """Everything needed to continue exactly where ``s`` is, as JSON-able data."""
    return {
        "version": SNAPSHOT_VERSION,
        "config": s.config.to_dict(),
        "tenants": [t.state() for t in s.tenants.values()],
        "in_flight": [r.to_dict() for r in s._in_flight.values()],
        "tree": s.tree.snapshot(),
        "next_seq": s._next_seq,
        "longest": [s.longest_prompt, s.longest_output],
        "workers": s.workers.snapshot(),
        "policy": s.policy.snapshot(),
        "settled": _rows(s),
        "resumed": sorted(s._resumed),
        "prefixes": s.prefixes.snapshot(),
        "lengths": s.lengths.snapshot(),
    }


def from_snapshot(data: Mapping[str, Any]) -> FairScheduler:
    from dispatcher.core.scheduler import FairScheduler
    from dispatcher.core.scheduler_config import SchedulerConfig

    if data.get("version") != SNAPSHOT_VERSION:
        raise ValueError(f"unsupported snapshot version {data.get('version')!r}")
    s = FairScheduler(SchedulerConfig.from_dict(data["config"]))
    s.tree.restore_nodes(data["tree"]["nodes"])
    for row in data["tenants"]:
        t = Tenant.from_state(row)
        s.tree.attach(t, t.parent)
        s.tenants[t.name] = t
        s._queued_ids.update((r.id, t.name) for r in t.queue)
    s._in_flight = {r["id"]: request_from_dict(r) for r in data["in_flight"]}
    s.tree.restore_waiting(data["tree"])
    s._next_seq = int(data["next_seq"])
    s.longest_prompt, s.longest_output = (int(v) for v in data["longest"])
    s.workers.restore(data["workers"])
    s.policy.restore(data["policy"])
    if data.get("lengths"):
        s.lengths.restore(dict(data["lengths"]))
    s._settled = _settled_rows(data["settled"])
    s._resumed = set(data.get("resumed", ()))
    s.prefixes.restore(data.get("prefixes", {}))
    if s.config.max_queue_s is not None:
        s._arrivals = sorted((r.arrival, r.seq, r.id) for t in s.tenants.values() for r in t.queue)  # a heap
    return s


def durable_state(s: FairScheduler) -> dict[str, Any]:
    """What a restarted dispatcher needs to continue fairly. An assignment that has not started is
    written as if refunded: after the restart it starts (and is adopted) or is submitted again."""
    nodes = {
        n.name: TreeNode(n.name, n.weight, n.parent, n.counter, n.service, n.lifted, n.implicit)
        for n in s.tree.nodes.values()
    }
    books = {t.name: Tenant(t.name, t.weight, t.counter, t.service, t.lifted) for t in s.tenants.values()}
    for t in s.tenants.values():
        books[t.name].ancestors = tuple(nodes[a.name] for a in t.ancestors)
    ledger = Ledger(s.cost, nodes)  # refunds on the copies
    for r in s._in_flight.values():
        if not r.started:
            move = ((r.prompt_tokens, 0), None), ((r.prompt_tokens, r.charged_output), None)
            ledger.account(books[r.tenant], *move, r.weight, r.path)
            ledger.account_cached(books[r.tenant], r.cached, 0, r.weight, r.path)
    rows = []
    for t in s.tenants.values():
        kept = books[t.name]
        rows.append({**{k: getattr(t, k) for k in _DURABLE_FIELDS}, "counter": kept.counter, "service": kept.service})
    tree_order = {n.name: i for i, n in enumerate(s.tree.snapshot_order())}
    return {
        "version": DURABLE_VERSION,
        "tenants": rows,
        "nodes": [n.row() for n in sorted(nodes.values(), key=lambda n: tree_order[n.name])],
        "charged": [
            [r.id, r.prompt_tokens, r.output_tokens, r.charged_output, r.weight, [list(p) for p in r.path]]
            for r in s._in_flight.values()
            if r.started
        ]
        + _rows(s),
        "next_seq": s._next_seq,
        "last_left": s.tree.root.last_left,
        "waiting_nodes": sorted(set(s.tree.waiting_nodes()) | s.tree.resumed | _nodes_of_unstarted(s)),
        # who was waiting (or assigned, not started: it comes back to its queue): they keep their
        # counters when their callers ask again, as if they had never stopped waiting
        "waiting": sorted(
            {*s.waiting_tenants(), *(r.tenant for r in s._in_flight.values() if not r.started)} | s._resumed
        ),
        "longest": [s.longest_prompt, s.longest_output],
        "policy": s.policy.snapshot(),
        "lengths": s.lengths.snapshot(),
    }


def restore_durable(s: FairScheduler, data: Mapping[str, Any]) -> None:
    """Continue from ``durable_state`` (on a fresh scheduler, before any request or worker)."""
    if data.get("version") not in (1, 2, DURABLE_VERSION):  # 1: no waiting set recorded; 2: no tree
        raise ValueError(f"unsupported state version {data.get('version')!r}")
    if s._in_flight or s._queued_ids:
        raise ValueError("restore_durable needs a scheduler with nothing queued or in flight")
    s.tree.restore_nodes(data.get("nodes", ()))
    for row in data["tenants"]:
        t = Tenant.from_state({**row, "queue": [], "in_flight": 0})
        s.tree.attach(t, t.parent)
        s.tenants[t.name] = t
    s._settled = _settled_rows(data["charged"])
    s._next_seq = int(data["next_seq"])
    last = data["last_left"]
    s.tree.root.last_left = last if last in s.tree.root.kids else None
    s.tree.resumed = {name for name in data.get("waiting_nodes", ()) if name in s.tree.nodes}
    s._resumed = {name for name in data.get("waiting", ()) if name in s.tenants}
    s.longest_prompt, s.longest_output = (int(v) for v in data.get("longest", (0, 0)))
    s.policy.restore(data.get("policy", data.get("predictor", {})))  # "predictor": older states
    if data.get("lengths"):
        s.lengths.restore(dict(data["lengths"]))


def _nodes_of_unstarted(s: FairScheduler) -> set[str]:
    """The nodes above requests assigned but not started: they come back to their queues."""
    return {a.name for r in s._in_flight.values() if not r.started for a in s.tenants[r.tenant].ancestors}


def _rows(s: FairScheduler) -> list[list[Any]]:
    return [[rid, p, o, c, w, [list(step) for step in path]] for rid, (p, o, c, w, path) in s._settled.items()]


def _settled_rows(rows: list[list[Any]]) -> dict[str, Settled]:
    """[id, prompt, output, charged output, weight, tree path] rows (older states have no weight: 1;
    no path: none)."""
    return {
        row[0]: (
            int(row[1]),
            int(row[2]),
            int(row[3]),
            float(row[4]) if len(row) > 4 else 1.0,
            tuple((str(name), float(w)) for name, w in row[5]) if len(row) > 5 else (),
        )
        for row in rows
    }
