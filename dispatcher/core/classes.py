"""Request classes (docs/architecture.md): e.g. interactive and batch within one tenant, weighted, never starving.

A class is a leaf of its tenant's own tree node, weighted against the tenant's other classes the way
siblings are (the tenant's default class keeps the tenant's name; ``tenant~batch`` holds its batch
requests), so the batch class of a busy key keeps its weight's share and cannot starve. A ``strict``
class (operator traffic) is served before everything else instead, and is charged to no node of the
fair tree. Within a class requests go in arrival order, which is also the order of their
first-token deadlines (``ttft_s``: one objective per class, so the earliest arrival has the
earliest deadline); a request put back at the head of its queue keeps its place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dispatcher.core.weights import weight_problem


@dataclass(frozen=True, slots=True)
class RequestClass:
    name: str
    weight: float = 1.0
    strict: bool = False
    ttft_s: float | None = None  # the class's first-token objective (reports count how often it is met)

    def __post_init__(self) -> None:
        if not self.name or "~" in self.name or len(self.name) > 32:
            raise ValueError(f"request class names are 1-32 characters without '~', got {self.name!r}")
        if problem := weight_problem(self.weight):
            raise ValueError(f"request class {self.name!r}: {problem}")
        if self.ttft_s is not None and not self.ttft_s > 0:
            raise ValueError(f"request class {self.name!r}: ttft_s must be positive, got {self.ttft_s}")

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
        )


def check_classes(classes: Iterable[RequestClass]) -> tuple[RequestClass, ...]:
    """The classes as given, refused when names repeat or no class is fair (not strict)."""
    classes = tuple(classes)
    if len({c.name for c in classes}) != len(classes):
        raise ValueError("request class names must be unique")
    if classes and all(c.strict for c in classes):
        raise ValueError("at least one request class must not be strict (the default class)")
    return classes


def leaf_name(tenant: str, klass: str, default: str) -> str:
    """The leaf that queues ``tenant``'s requests of class ``klass`` (the tenant's own for its default)."""
    return tenant if not klass or klass == default else f"{tenant}~{klass}"


def default_class(classes: Iterable[RequestClass]) -> str:
    """The first class that is not strict ("" when there are no classes)."""
    return next((c.name for c in classes if not c.strict), "")
