"""The interface every fairness policy implements, and the registry of policies by name.

A policy answers five questions for the scheduler (docs/architecture.md):

- **order between tenants**: ``key_function`` gives each waiting tenant a key from its record (its
  counter, weight, requests in flight or finished, its oldest request); the smallest is served next.
  Keys may grow at any time (the waiting set re-keys lazily); the scheduler re-keys a tenant itself
  after every event that can lower one (a refund, a finished or lost request, a request put back at
  the head of its queue, a weight change).
- **order within a tenant**: ``next_request`` (FIFO unless a policy says otherwise).
- **admission**: ``admit``, asked once per request before it may queue.
- **re-joining**: ``rejoin``, when a tenant with an empty queue gets a request (VTC's lift).
- **charging ahead**: ``predict``, output tokens charged at dispatch (VTC with length prediction);
  ``observe`` learns from finished requests.
- **tenant tree**: ``tree`` says the policy orders by counters (its key is the tenant's counter), so
  the same order extends to tree nodes and request classes, its ``rejoin`` applied at every level.
- **locality slack**: ``locality_slack`` (key units; 0 for most): the scheduler may serve, instead of
  the first tenant in order, one whose key is within the slack of it when that one's next request
  finds a longer cached prefix on a worker with room.

Each policy states its guarantee in its docstring and in ``bound``: the largest difference of
weight-normalised service between two tenants backlogged over the same interval, in units where the
smaller weight is 1 (docs/architecture.md: ``|W_f/w_f - W_g/w_g| <= bound / min(w_f, w_g)``), or None when it
promises none. ``work_conserving`` says whether it never refuses or holds back a request while a
worker could start it. The conformance suite checks both on random workloads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from fairgate.core.model import Request, Tenant
from fairgate.core.registry import Param, Registry, spec_text

POLICIES: Registry[type[FairnessPolicy]] = Registry("policy")
register = POLICIES.register


class FairnessPolicy:
    """Base class: FIFO within a tenant, everyone admitted, no lift, nothing charged ahead."""

    name: ClassVar[str]
    params: ClassVar[tuple[Param, ...]] = ()  # each an attribute of the same name (``spec`` writes them)
    examples: ClassVar[tuple[str, ...]] = ()  # specs that build it (the conformance suite runs each)
    work_conserving: ClassVar[bool] = True
    tree: ClassVar[bool] = False  # orders by counters, so tree nodes and request classes can be ordered alike
    locality_slack: float = 0.0  # docs/architecture.md: may serve a tenant this far above the least-served one

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    @property
    def spec(self) -> str:
        """The text that builds this policy again (``make_policy(policy.spec)``)."""
        return spec_text(type(self), {p.name: getattr(self, p.name) for p in self.params})

    # ------------------------------------------------------------------ the policy's decisions

    def key_function(self, tenants: Mapping[str, Tenant]) -> Callable[[str], float]:
        """The order between waiting tenants: a function of a waiting tenant's name (smaller first)."""
        raise NotImplementedError

    def next_request(self, tenant: Tenant) -> Request:
        """The order within a tenant: which of its waiting requests goes next."""
        return tenant.queue[0]

    def admit(self, tenant: Tenant, now: float) -> bool:
        """Whether a request of ``tenant`` arriving at ``now`` may queue (False: rate_limited)."""
        return True

    def rejoin(self, tenant: Tenant, floor: Callable[[], Tenant | None]) -> None:
        """``tenant`` re-joins the waiting set. ``floor()`` is the least-served waiting tenant, or the
        last one to leave the waiting set when no one waits (None when neither exists)."""
        return None

    def predict(self, tenant: Tenant, request: Request) -> int:
        """Output tokens to charge at dispatch, ahead of their generation."""
        return 0

    def observe(self, tenant: str, output_tokens: int) -> None:
        """A request of ``tenant`` finished normally with ``output_tokens``."""
        return None

    def bound(self, u: float) -> float | None:
        """The promised bound on backlogged tenants' service difference, given U (or None)."""
        return None

    # ------------------------------------------------------------------ state (snapshots)

    def snapshot(self) -> dict[str, Any]:
        """The policy's own state, as JSON-able data."""
        return {}

    def restore(self, data: Mapping[str, Any]) -> None:
        return None
