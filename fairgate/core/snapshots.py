"""A scheduler as data, and back: whole snapshots (experiments, tests) and the durable state a restarted
dispatcher continues from (written to Redis every second).

A snapshot is every part's own snapshot (``Part``), so a restored scheduler makes exactly the decisions
the original would have made: a part that keeps something keeps it in its snapshot too, and the
conformance suite compares every field of every part after a restore. The durable state holds only
what cannot come back from elsewhere: counters, the last tenant to leave the waiting set, the policy's
own state and what each running request was charged. After a restart the waiting requests come back
from their callers and the running ones from their workers (``FairScheduler.adopt``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from fairgate.core.in_flight import InFlight
from fairgate.core.ledger import Ledger
from fairgate.core.model import Tenant
from fairgate.core.recovery import Recovery
from fairgate.core.scheduler_config import SchedulerConfig
from fairgate.core.scheduler_views import waiting_tenants
from fairgate.core.settlement import Settlement
from fairgate.core.tenant_book import TenantBook
from fairgate.core.tree import TreeNode


class Part(Protocol):
    """A part of the scheduler with state of its own: it writes all of it, and reads it back."""

    def snapshot(self) -> Any: ...

    def restore(self, data: Any) -> None: ...


SNAPSHOT_VERSION = 4  # 4: a part per key (3 and before: one record of the scheduler's fields)
DURABLE_VERSION = 4  # 4: running requests' output written as refunded (3: as charged so far)
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


def snapshot(config: SchedulerConfig, parts: Mapping[str, Part]) -> dict[str, Any]:
    """Everything needed to continue exactly where the scheduler of these parts is, as JSON-able data."""
    return {"version": SNAPSHOT_VERSION, "config": config.to_dict()} | {name: p.snapshot() for name, p in parts.items()}


def config_of(data: Mapping[str, Any]) -> SchedulerConfig:
    """The settings a scheduler restored from ``data`` must be built with (its version checked)."""
    if data.get("version") != SNAPSHOT_VERSION:
        raise ValueError(f"unsupported snapshot version {data.get('version')!r}")
    return SchedulerConfig.from_dict(data["config"])


def restore(parts: Mapping[str, Part], data: Mapping[str, Any]) -> None:
    """Continue exactly where ``snapshot`` was taken, on a fresh scheduler built with ``config_of``'s
    settings (its parts in the order they restore in)."""
    for name, part in parts.items():
        part.restore(data[name])


def durable_state(
    book: TenantBook, flights: InFlight, recovery: Recovery, settlement: Settlement, saved_at: float | None = None
) -> dict[str, Any]:
    """What a restarted dispatcher needs to continue fairly. An assignment that has not started is
    written as if refunded: after the restart it starts (and is adopted) or is submitted again. So is
    the output of a running request (not what a prediction charged beyond it): its worker re-announces
    it with every token so far, charged again then, and its row stays the same while it generates, so
    that a journal of changes (``fairgate.core.journal``) holds starts and ends, not every token.
    ``saved_at``: now, on the clock its tickets' expiries are read from."""
    tree = book.tree
    nodes = {
        n.name: TreeNode(n.name, n.weight, n.parent, n.counter, n.service, n.lifted, n.implicit)
        for n in tree.nodes.values()
    }
    tenants = book.tenants
    books = {t.name: Tenant(t.name, t.weight, t.counter, t.service, t.lifted) for t in tenants.values()}
    for t in tenants.values():
        books[t.name].ancestors = tuple(nodes[a.name] for a in t.ancestors)
    ledger = Ledger(settlement.ledger.cost, nodes)  # refunds on the copies
    unstarted = flights.unstarted()
    for r in unstarted:
        move = ((r.prompt_tokens, 0), None), ((r.prompt_tokens, r.charged_output), None)
        ledger.account(books[r.tenant], *move, r.weight, r.path)
        ledger.account_cached(books[r.tenant], r.cached, 0, r.weight, r.path)
    charged: list[list[Any]] = []
    running_output: dict[str, int] = {}
    for r in flights:
        if not r.started:
            continue
        # its output written as refunded (what was charged ahead of it, beyond it, kept), as adoption
        # charges it again (``Recovery.adopt``: at the tenant's weight then, to its request's path): the
        # worker's re-announcement charges it back, and its row does not change while it generates
        ahead = r.charged_output if r.charged_output > r.output_tokens else 0
        served = (r.prompt_tokens, r.output_tokens), (r.prompt_tokens, 0)
        charge = (r.prompt_tokens, r.charged_output), (r.prompt_tokens, ahead)
        ledger.account(books[r.tenant], served, charge, path=r.path)
        running_output[r.tenant] = running_output.get(r.tenant, 0) + r.output_tokens
        charged.append([r.id, r.prompt_tokens, 0, ahead, r.weight, [list(p) for p in r.path]])
    rows = []
    for t in tenants.values():
        kept = books[t.name]
        row = {k: getattr(t, k) for k in _DURABLE_FIELDS}
        row["output_tokens"] -= running_output.get(t.name, 0)
        rows.append(row | {"counter": kept.counter, "service": kept.service})
    tree_order = {n.name: i for i, n in enumerate(tree.snapshot_order())}
    nodes_of_unstarted = {a.name for r in unstarted for a in tenants[r.tenant].ancestors}
    return {
        "version": DURABLE_VERSION,
        "tenants": rows,
        "nodes": [n.row() for n in sorted(nodes.values(), key=lambda n: tree_order[n.name])],
        "charged": charged + recovery.settled_rows(),
        "next_seq": flights.next_seq,
        "last_left": tree.root.last_left,
        # the nodes above requests assigned and not started come back with them
        "waiting_nodes": sorted(set(tree.waiting_nodes()) | tree.resumed | nodes_of_unstarted),
        # who was waiting (or assigned, not started: it comes back to its queue): they keep their
        # counters when their callers ask again, as if they had never stopped waiting
        "waiting": sorted({*waiting_tenants(book), *(r.tenant for r in unstarted)} | recovery.resumed),
        "longest": flights.longest(),
        "policy": book.policy.snapshot(),
        "lengths": settlement.lengths.snapshot(),
        "budget": settlement.budget.snapshot(),
        "saved_at": saved_at,
        # written as refunded above: one that starts and ends before the restart is in no saved counter
        "unstarted": sorted(r.id for r in unstarted),
    }


def restore_durable(
    book: TenantBook,
    flights: InFlight,
    recovery: Recovery,
    settlement: Settlement,
    data: Mapping[str, Any],
    now: float | None = None,
) -> None:
    """Continue from ``durable_state`` (on a fresh scheduler, before any request or worker); ``now``:
    when, on the clock the state's ``saved_at`` was read from."""
    if data.get("version") not in (1, 2, 3, DURABLE_VERSION):  # 1: no waiting set recorded; 2: no tree
        raise ValueError(f"unsupported state version {data.get('version')!r}")
    tree = book.tree
    tree.restore_nodes(data.get("nodes", ()))
    for row in data["tenants"]:
        t = Tenant.from_state({**row, "queue": [], "in_flight": 0})
        tree.attach(t, t.parent)
        book.tenants[t.name] = t
    flights.next_seq = int(data["next_seq"])
    last = data["last_left"]
    tree.root.last_left = last if last in tree.root.kids else None
    tree.resumed = {name for name in data.get("waiting_nodes", ()) if name in tree.nodes}
    recovery.continue_from(
        data["charged"], data.get("waiting", ()), data.get("unstarted", ()), data.get("saved_at"), now
    )
    flights.restore_longest(data.get("longest", (0, 0)))
    book.policy.restore(data.get("policy", data.get("predictor", {})))  # "predictor": older states
    if data.get("lengths"):
        settlement.lengths.restore(dict(data["lengths"]))
    if data.get("budget"):
        settlement.budget.restore(dict(data["budget"]))
