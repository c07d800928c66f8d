"""The scheduler's settings (``SchedulerConfig``), as plain data that travels in snapshots and configs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fairgate.core.classes import RequestClass, check_classes
from fairgate.core.costs import CostFunction, LinearCost, cost_from_spec
from fairgate.core.placement import make_placement
from fairgate.core.policies import make_policy


@dataclass(frozen=True)
class SchedulerConfig:
    """Knobs of the scheduler. ``policy``: the fairness policy's spec (``vtc``, ``rpm:5``, ...);
    ``placement``: the placement rule's (``most-room``, ...): each kept as the text that builds it.

    ``strict_head_of_line``: when the policy's next request fits nowhere, stop (True, the default) or
    try up to ``relaxed_scan`` further tenants in the policy's order.
    Admission is by each engine's own rule (``fairgate.core.workers``): nothing is reserved for a
    request's output, so a tenant that asks for far more ``max_tokens`` than it uses holds nothing
    beyond what it uses. ``max_engine_waiting``: the most requests that may wait inside one engine
    beyond those it can start now (the queue's depth follows the engine's turnover up to this; 0: no
    queue, so an engine may lack work while its next assignment is on its way); the fairness bound
    grows with it (``fairness_bound``). ``overcommit``: the requests in flight on a worker are expected
    to reach at most this many KV pools (each its prompt and its tenant's usual output, the mean of its
    last 20 times ``FOOTPRINT_HEADROOM``, ``max_tokens`` while nothing is known): past one pool the
    engine preempts, as it does alone; the cap keeps a tenant of tiny prompts and long outputs from
    filling an engine with far more than it can hold, whose growth would otherwise run past VTC's
    bound while the others wait (docs/results.md has the run that showed it).
    ``max_queued_per_tenant`` / ``max_queued``: caps on requests waiting (one tenant's / everyone's);
    ``max_queue_s``: a request still waiting after this long is withdrawn (``expire``). None: no limit.
    ``classes``: the request classes (``fairgate.core.classes``; the first one not strict is the
    default); they, like a tenant tree, need a policy that orders by counters (``FairnessPolicy.tree``).
    ``objective_reserve``: while a class enforces its first-token objective, the share of each engine's
    KV pool that only its requests may start into (``WorkerTable.place``).
    ``revoke``: take back requests an engine holds unstarted from tenants more served than the one
    that waits with nowhere to go (``fairgate.core.revocation``); on by default, so that a request
    waiting inside an engine's queue still counts as waiting (docs/architecture.md, "Revocation").
    ``threshold``: take back running requests of a tenant whose counter passes the least-served
    waiting tenant's by more than this (cost units at weight 1; ``fairgate.core.threshold``); None: off.
    """

    policy: str = "vtc"
    cost: CostFunction = field(default_factory=LinearCost)
    placement: str = "most-room"
    strict_head_of_line: bool = True
    relaxed_scan: int = 16
    max_engine_waiting: int = 8
    overcommit: float = 2.0
    seed: int = 0
    max_queued_per_tenant: int | None = None
    max_queued: int | None = None
    max_queue_s: float | None = None
    classes: tuple[RequestClass, ...] = ()
    objective_reserve: float = 0.1
    revoke: bool = True
    threshold: float | None = None

    def __post_init__(self) -> None:
        policy = make_policy(self.policy, self.seed)  # refuses unknown ones
        object.__setattr__(self, "policy", policy.spec)
        object.__setattr__(self, "classes", check_classes(self.classes))
        if self.classes and not policy.tree:
            raise ValueError(f"request classes need a policy that orders by counters, not {policy.name!r}")
        object.__setattr__(self, "placement", make_placement(self.placement).spec)
        if not self.overcommit >= 1.0:
            raise ValueError(f"overcommit must be at least 1, got {self.overcommit}")
        if not 0.0 <= self.objective_reserve < 1.0:
            raise ValueError(f"objective_reserve must be in [0, 1), got {self.objective_reserve}")
        if self.threshold is not None and not self.threshold >= 0:
            raise ValueError(f"threshold must be at least 0, got {self.threshold}")
        if self.max_engine_waiting < 0:
            raise ValueError(f"max_engine_waiting must be >= 0, got {self.max_engine_waiting}")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "cost": self.cost.spec(),
            "classes": [c.to_dict() for c in self.classes],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SchedulerConfig:
        policy = data.get("policy", "vtc")
        return cls(
            policy=policy["name"] if isinstance(policy, Mapping) else str(policy),  # older configs: a record
            cost=cost_from_spec(data.get("cost")),
            placement=str(data.get("placement", "most-room")),
            strict_head_of_line=bool(data.get("strict_head_of_line", True)),
            relaxed_scan=int(data.get("relaxed_scan", 16)),
            max_engine_waiting=int(data.get("max_engine_waiting", 8)),
            overcommit=float(data.get("overcommit", 2.0)),
            seed=int(data.get("seed", 0)),
            max_queued_per_tenant=_optional(data.get("max_queued_per_tenant"), int),
            max_queued=_optional(data.get("max_queued"), int),
            max_queue_s=_optional(data.get("max_queue_s"), float),
            classes=tuple(RequestClass.from_dict(c) for c in data.get("classes") or ()),
            objective_reserve=float(data.get("objective_reserve", 0.1)),
            revoke=bool(data.get("revoke", True)),
            threshold=_optional(data.get("threshold"), float),
        )


def _optional(value: Any, kind: type) -> Any:
    return None if value is None else kind(value)
