"""The pure fairness core: no Ray, gRPC, asyncio, Redis or I/O; time is passed in."""

from dispatcher.core.capacity import Demand, ReplicaCapacity, desired_replicas
from dispatcher.core.costs import CostFunction, LinearCost, ProfiledCost, cost_from_spec, fit_profiled_cost
from dispatcher.core.model import Request, Tenant
from dispatcher.core.policies import POLICY_NAMES, Policy, parse_policy
from dispatcher.core.predictors import MovingAveragePredictor, NoPredictor, OraclePredictor
from dispatcher.core.scheduler import (
    FINISH_WORKER_LOST,
    REJECT_QUEUE_FULL,
    REJECT_QUEUE_TIMEOUT,
    REJECT_RATE_LIMITED,
    REJECT_TENANT_QUEUE_FULL,
    REJECT_TOO_LARGE,
    Assignment,
    FairScheduler,
    LeaveResult,
    SchedulerConfig,
)
from dispatcher.core.workers import WorkerSlot, WorkerTable

__all__ = [
    "FINISH_WORKER_LOST",
    "POLICY_NAMES",
    "REJECT_QUEUE_FULL",
    "REJECT_QUEUE_TIMEOUT",
    "REJECT_RATE_LIMITED",
    "REJECT_TENANT_QUEUE_FULL",
    "REJECT_TOO_LARGE",
    "Assignment",
    "CostFunction",
    "Demand",
    "FairScheduler",
    "LeaveResult",
    "LinearCost",
    "MovingAveragePredictor",
    "NoPredictor",
    "OraclePredictor",
    "Policy",
    "ProfiledCost",
    "ReplicaCapacity",
    "Request",
    "SchedulerConfig",
    "Tenant",
    "WorkerSlot",
    "WorkerTable",
    "cost_from_spec",
    "desired_replicas",
    "fit_profiled_cost",
    "parse_policy",
]
