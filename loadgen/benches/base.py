"""The interface every benchmark implements, and the registry of benchmarks by name.

A bench is a plug-in like a policy (``fairgate.core.registry``): one module in this package with a
``Bench`` subclass decorated with ``@register``, stating its options as parameters (each becomes a
``--flag`` of ``fairgate bench NAME``), checking them, running, and writing its report from the figures
its run returns (the same figures ``--json`` writes). ``fairgate bench`` is a loop over the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from fairgate.core.registry import Param, Registry

BENCHES: Registry[type[Bench]] = Registry("bench")
register = BENCHES.register

Options = Mapping[str, Any]  # an option's name (as its parameter's) -> its typed value
Figures = dict[str, Any]  # what a run measured, JSON-able: the report is written from it


class Bench:
    """One benchmark: ``params`` its options (defaults are what the docs' figures were measured with)."""

    name: ClassVar[str]
    help: ClassVar[str]
    params: ClassVar[tuple[Param, ...]] = ()

    def check(self, options: Options) -> None:
        """Refuse options that cannot run (``ValueError`` naming the option); nothing by default."""
        return None

    def run(self, options: Options) -> Figures:
        raise NotImplementedError

    def report(self, figures: Figures) -> str:
        """The text ``fairgate bench`` prints."""
        raise NotImplementedError


def numbers(text: str, option: str, kind: type = int, least: float = 1) -> tuple[Any, ...]:
    """A comma-separated option of numbers, each at least ``least`` (``ValueError`` naming it else)."""
    try:
        values = tuple(kind(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{option}: comma-separated numbers, got {text!r}") from None
    if not values or any(v < least for v in values):
        raise ValueError(f"{option}: at least one number, each at least {least:g}")
    return values


def names(text: str, option: str, known: Any) -> tuple[str, ...]:
    """A comma-separated option of names, each one of ``known``."""
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values or any(v not in known for v in values):
        raise ValueError(f"{option}: a list of {', '.join(known)}")
    return values
