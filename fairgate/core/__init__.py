"""The pure fairness core: no Ray, gRPC, asyncio, Redis or I/O; time is passed in.

Tenants and requests (``model``), the scheduler that keeps their queues and counters
(``scheduler``), the fairness policies (``policies``, one module each) and placement rules
(``placement``, one module each) it is driven by, the ledger every charge goes through (``ledger``),
cost functions and length predictors, the worker capacity table, snapshots, the fairness figures
(``fairness``: the one 2U) and the autoscaling rule (``capacity``). The calls the rest of the gateway
makes of it are listed in one table: docs/layout.md, "the core's public surface".
"""

from fairgate.core.capacity import Demand, ReplicaCapacity, desired_replicas
from fairgate.core.costs import CostFunction, LinearCost, ProfiledCost, cost_from_spec, fit_profiled_cost
from fairgate.core.fairness import backlogged_gap, engine_queue_slack, jain_index, two_u, unit_u
from fairgate.core.model import Request, Tenant
from fairgate.core.placement import PlacementRule, make_placement, placement_names
from fairgate.core.policies import FairnessPolicy, make_policy, policy_names, policy_usages
from fairgate.core.reasons import (
    FINISH_WORKER_LOST,
    REJECT_QUEUE_FULL,
    REJECT_QUEUE_TIMEOUT,
    REJECT_RATE_LIMITED,
    REJECT_TENANT_QUEUE_FULL,
    REJECT_TOO_LARGE,
    REJECT_UNKNOWN_KEY,
)
from fairgate.core.recovery import LeaveResult
from fairgate.core.scheduler import Assignment, FairScheduler
from fairgate.core.scheduler_config import SchedulerConfig
from fairgate.core.workers import WorkerSlot, WorkerTable

__all__ = [
    "FINISH_WORKER_LOST",
    "REJECT_QUEUE_FULL",
    "REJECT_QUEUE_TIMEOUT",
    "REJECT_RATE_LIMITED",
    "REJECT_TENANT_QUEUE_FULL",
    "REJECT_TOO_LARGE",
    "REJECT_UNKNOWN_KEY",
    "Assignment",
    "CostFunction",
    "Demand",
    "FairScheduler",
    "FairnessPolicy",
    "LeaveResult",
    "LinearCost",
    "PlacementRule",
    "ProfiledCost",
    "ReplicaCapacity",
    "Request",
    "SchedulerConfig",
    "Tenant",
    "WorkerSlot",
    "WorkerTable",
    "backlogged_gap",
    "cost_from_spec",
    "desired_replicas",
    "engine_queue_slack",
    "fit_profiled_cost",
    "jain_index",
    "make_placement",
    "make_policy",
    "placement_names",
    "policy_names",
    "policy_usages",
    "two_u",
    "unit_u",
]
