"""Plain records the scheduler keeps: requests and tenants. Policies keep their own state (e.g. RPM's
admission windows) in their own objects."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(slots=True)
class Request:
    """One request as the dispatcher sees it: metadata only, never the prompt text.

    ``charged_output``: output tokens already charged to the tenant's counter (a prediction is charged
    up front, so it can run ahead of ``output_tokens``). ``need``: KV tokens the engine must have free to
    admit it (its prompt and the first output token's slot: the engine's own rule; nothing is reserved
    for the output, which the engine's preemption covers). ``priority``: the engine's preemption rank
    the dispatcher gave it (larger: preempted first).
    ``true_output`` is known only in experiments (the oracle predictor reads it). ``weight``: the
    tenant's weight when it was dispatched, which the dispatch charge was divided by (its refunds and
    corrections use it too). ``prefix``: the chained hashes of the prompt's full blocks of
    ``block_tokens`` tokens (salted per tenant; empty when unknown); ``cached``: prompt tokens charged
    as found in the engine's prefix cache (expected at dispatch, the engine's count from its start).
    """

    id: str
    tenant: str
    prompt_tokens: int
    max_tokens: int
    arrival: float
    seq: int
    need: int = 0
    true_output: int | None = None
    worker: str | None = None
    predicted: int = 0
    output_tokens: int = 0
    charged_output: int = 0
    started: bool = False
    dispatched_at: float | None = None
    weight: float = 1.0
    prefix: tuple[int, ...] = ()
    block_tokens: int = 0
    cached: int = 0
    priority: int = 0
    footprint: int = 0  # KV it is expected to reach: its prompt and its tenant's usual output (the over-commit cap)
    beyond_room: bool = False  # assigned to wait in its engine's queue (no room for it then)
    passed: int = 0  # times a later request of its tenant went first for its cached prefix
    path: tuple[tuple[str, float], ...] = ()  # its tenant's tree nodes and their weights at dispatch
    predicted_wait: float | None = None  # its first-token wait as predicted at submission (objective classes)
    urgent: bool = False  # its class enforces a first-token objective (placed past queues and the KV reserve)
    held: float = 0.0  # cost charged at its dispatch while it has not started (kept under revoke)
    adapter: str = ""  # the LoRA adapter it is served with ("": the base model)
    refused: bool = False  # its engine would not give it back: begun there, its start not yet reported
    handed: int = 0  # when it was last dispatched, in the scheduler's sequence (its place in its engine's queue)
    home: str = ""  # the worker an earlier request it extends went to (``continuations``)
    home_seq: int = 0  # when it was homed there, in the continuations' own sequence

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def start_need(prompt_tokens: int) -> int:
    """KV tokens an engine must have free to admit a prompt: the prompt and its first output token."""
    return prompt_tokens + 1


def request_from_dict(data: dict[str, Any]) -> Request:
    """A request from ``to_dict`` (through JSON: its tuples came back as lists)."""
    path = tuple((str(name), float(w)) for name, w in data.get("path", ()))
    return Request(**data | {"prefix": tuple(data.get("prefix", ())), "path": path})


@dataclass(slots=True, eq=False)
class Tenant:
    """A tenant's fairness state.

    ``counter``: VTC's virtual counter (weighted charges, including predictions and lifts).
    ``service``: exact service delivered, in cost units, unweighted. ``lifted``: total added by lifts,
    so that counter == service / weight + lifted once every prediction is settled. ``parent``: the
    tree node it is a leaf of ("": the root; docs/architecture.md: tree); ``ancestors``: that node and the
    ones above it up to the root (excluded), which every charge of this tenant is charged to as well.
    """

    name: str
    weight: float = 1.0
    counter: float = 0.0
    service: float = 0.0
    lifted: float = 0.0
    queue: deque[Request] = field(default_factory=deque)
    queued_tokens: int = 0
    in_flight: int = 0
    submitted: int = 0
    rejected: int = 0
    finished: int = 0
    revoked: int = 0  # its requests taken back unstarted from an engine for a less served tenant (revoke)
    output_tokens: int = 0  # generated for this tenant, as the workers reported them
    prompt_tokens: int = 0  # of its requests that started, and of those the engines found cached
    cached_tokens: int = 0
    parent: str = ""
    ancestors: tuple[Any, ...] = ()  # TreeNode records, nearest first (kept by the tree, not saved)
    outgrown: int = 0  # the most output any of its requests in flight reached past its footprint
    unstarted: float = 0.0  # of ``counter``, charged for requests its engines hold unstarted (kept under revoke)

    def state(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "weight": self.weight,
            "counter": self.counter,
            "service": self.service,
            "lifted": self.lifted,
            "queue": [r.to_dict() for r in self.queue],
            "in_flight": self.in_flight,
            "submitted": self.submitted,
            "rejected": self.rejected,
            "revoked": self.revoked,
            "finished": self.finished,
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "parent": self.parent,
            "outgrown": self.outgrown,
            "unstarted": self.unstarted,
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> Tenant:
        queue = deque(request_from_dict(r) for r in data["queue"])
        return cls(
            name=data["name"],
            weight=float(data["weight"]),
            counter=float(data["counter"]),
            service=float(data["service"]),
            lifted=float(data["lifted"]),
            queue=queue,
            queued_tokens=sum(r.prompt_tokens + r.max_tokens for r in queue),
            in_flight=int(data["in_flight"]),
            submitted=int(data["submitted"]),
            rejected=int(data["rejected"]),
            revoked=int(data.get("revoked", 0)),
            finished=int(data["finished"]),
            output_tokens=int(data.get("output_tokens", 0)),
            prompt_tokens=int(data.get("prompt_tokens", 0)),
            cached_tokens=int(data.get("cached_tokens", 0)),
            parent=str(data.get("parent", "")),
            outgrown=int(data.get("outgrown", 0)),
            unstarted=float(data.get("unstarted", 0.0)),
        )
