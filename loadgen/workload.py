"""A workload: a list of requests (tenant, arrival time, prompt and output length) with the tenants'
weights, tree and classes. The simulator, ``fairgate loadgen`` and the benches replay the same lists;
``fairgate.loadgen.workloads`` makes the paper's, ``fairgate.loadgen.workload_spec`` reads them from names and files,
``fairgate.loadgen.mooncake`` from the Mooncake trace."""

from __future__ import annotations

from dataclasses import dataclass, field

from fairgate.core.classes import RequestClass, default_class, leaf_name


class WorkloadError(ValueError):
    """A workload name, file or spec that cannot be used; the message names the problem."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request: ``output_tokens`` is what it generates; ``max_tokens`` what it asks for (None:
    exactly what it generates, as in the paper's traces). ``prefix``: the chained hashes of its
    prompt's full blocks (the workload's ``prefix_block`` tokens each; empty when unknown), already
    salted per tenant, as the ingress salts them."""

    tenant: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int | None = None
    prefix: tuple[int, ...] = ()
    klass: str = ""  # its request class ("": the default)
    leaves: bool = False  # its client goes away after ``output_tokens``, before it ends by itself
    adapter: str = ""  # the LoRA adapter it asks for ("": the base model); its prefix is that adapter's


@dataclass
class Workload:
    """Requests sorted by arrival. ``kv_tokens``: a pool size the workload asks for (ablations).
    ``tree``: tenant tree nodes (name, parent, weight), parents first; ``parents``: each tenant's node
    (absent: the root); ``classes``: the request classes its requests name (docs/architecture.md)."""

    name: str
    duration_s: float
    requests: list[TraceRequest]
    weights: dict[str, float] = field(default_factory=dict)
    kv_tokens: int | None = None
    prefix_block: int = 0  # tokens per prefix hash (0: the requests carry none)
    tree: list[tuple[str, str, float]] = field(default_factory=list)
    parents: dict[str, str] = field(default_factory=dict)
    classes: tuple[RequestClass, ...] = ()
    # closed-loop tenants: each of their requests, when it ends, is followed at once by a copy of it, so
    # that their first requests (all arriving at the start) stay outstanding until ``duration_s``
    outstanding: dict[str, int] = field(default_factory=dict)

    @property
    def tenants(self) -> list[str]:
        """The leaves that queue requests: tenants, and ``tenant~class`` for a non-default class."""
        default = default_class(self.classes)
        seen = dict.fromkeys(self.weights)
        for r in self.requests:
            seen.setdefault(leaf_name(r.tenant, r.klass, default))
        return list(seen)

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def longest(self) -> tuple[int, int]:
        """The longest prompt and the longest output among the requests (what 2U depends on)."""
        return (
            max((r.prompt_tokens for r in self.requests), default=0),
            max((r.output_tokens for r in self.requests), default=0),
        )

    def truncated(self, seconds: float | None) -> Workload:
        """The first ``seconds`` of this workload (itself when None or longer)."""
        if seconds is None or seconds >= self.duration_s:
            return self
        kept = [r for r in self.requests if r.arrival_s < seconds]
        return Workload(
            self.name,
            seconds,
            kept,
            dict(self.weights),
            self.kv_tokens,
            self.prefix_block,
            list(self.tree),
            dict(self.parents),
            self.classes,
        )
