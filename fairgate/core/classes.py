"""Request classes (docs/architecture.md): e.g. interactive and batch within one tenant, weighted, never starving.

A class is a leaf of its tenant's own tree node, weighted against the tenant's other classes the way
siblings are (the tenant's default class keeps the tenant's name; ``tenant~batch`` holds its batch
requests), so the batch class of a busy key keeps its weight's share and cannot starve. A ``strict``
class (operator traffic) is served before everything else instead, and is charged to no node of the
fair tree. Within a class requests go in arrival order, which is also the order of their
first-token deadlines (``ttft_s``: one objective per class, so the earliest arrival has the
earliest deadline); a request put back at the head of its queue keeps its place.

A class with an objective says what happens to a request predicted to miss it (``on_miss``):
``queue`` (it waits anyway), ``shed`` (refused at once, with when to retry) or ``downgrade`` (served
in the class ``downgrade_to``). Either only touches the class's own requests: no enforcement takes
another tenant's share (``fairgate.core.wait_prediction``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from fairgate.core.weights import weight_problem

ON_MISS = ("queue", "shed", "downgrade")


@dataclass(frozen=True, slots=True)
class RequestClass:
    name: str
    weight: float = 1.0
    strict: bool = False
    ttft_s: float | None = None  # the class's first-token objective (reports count how often it is met)
    on_miss: str = "queue"  # a request predicted to miss ttft_s: queue, shed or downgrade
    downgrade_to: str = ""  # the class a downgraded request is served in

    def __post_init__(self) -> None:
        if not self.name or "~" in self.name or len(self.name) > 32:
            raise ValueError(f"request class names are 1-32 characters without '~', got {self.name!r}")
        if problem := weight_problem(self.weight):
            raise ValueError(f"request class {self.name!r}: {problem}")
        if self.ttft_s is not None and not self.ttft_s > 0:
            raise ValueError(f"request class {self.name!r}: ttft_s must be positive, got {self.ttft_s}")
        if self.on_miss not in ON_MISS:
            raise ValueError(f"request class {self.name!r}: on_miss must be one of {', '.join(ON_MISS)}")
        if self.on_miss != "queue" and self.ttft_s is None:
            raise ValueError(f"request class {self.name!r}: on_miss {self.on_miss!r} needs a ttft_s objective")
        if (self.on_miss == "downgrade") != bool(self.downgrade_to):
            raise ValueError(f"request class {self.name!r}: downgrade_to goes with on_miss 'downgrade', and only")

    @property
    def enforced(self) -> bool:
        """Whether its objective is enforced: its requests are judged at submission and served urgently."""
        return self.on_miss != "queue"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestClass:
        ttft = data.get("ttft_s")
        return cls(
            str(data["name"]),
            float(data.get("weight", 1.0)),
            bool(data.get("strict", False)),
            None if ttft is None else float(ttft),
            str(data.get("on_miss") or "queue"),
            str(data.get("downgrade_to") or ""),
        )


def check_classes(classes: Iterable[RequestClass]) -> tuple[RequestClass, ...]:
    """The classes as given, refused when names repeat or no class is fair (not strict)."""
    classes = tuple(classes)
    if len({c.name for c in classes}) != len(classes):
        raise ValueError("request class names must be unique")
    if classes and all(c.strict for c in classes):
        raise ValueError("at least one request class must not be strict (the default class)")
    by_name = {c.name: c for c in classes}
    for c in classes:
        if not c.downgrade_to:
            continue
        target = by_name.get(c.downgrade_to)
        if target is None or target is c:
            raise ValueError(f"request class {c.name!r}: downgrade_to names no other class: {c.downgrade_to!r}")
        if target.strict or target.on_miss == "downgrade":
            raise ValueError(f"request class {c.name!r}: downgrade to a fair class that downgrades no further")
    return classes


def leaf_name(tenant: str, klass: str, default: str) -> str:
    """The leaf that queues ``tenant``'s requests of class ``klass`` (the tenant's own for its default)."""
    return tenant if not klass or klass == default else f"{tenant}~{klass}"


def default_class(classes: Iterable[RequestClass]) -> str:
    """The first class that is not strict ("" when there are no classes)."""
    return next((c.name for c in classes if not c.strict), "")
