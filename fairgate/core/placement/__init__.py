"""Placement rules as plug-ins: which worker a request that fits several should start on.

Placement is separate from fairness (docs/architecture.md): the policy picks *which request* goes next, the
placement rule picks *where*, among the workers that can start it now. One module per rule in this
package, a ``PlacementRule`` subclass decorated with ``@register``; ``make_placement(spec)`` builds one
from a spec as every plug-in is built (``fairgate.core.registry``), and every registered rule runs
through the conformance suite.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairgate.core.placement.base import PLACEMENTS, PlacementRule, register
from fairgate.core.registry import discover

__all__ = ["PlacementRule", "make_placement", "placement_names", "register"]

discover(__name__, __path__)


def placement_names() -> list[str]:
    return PLACEMENTS.names()


def make_placement(spec: str | Mapping[str, Any]) -> PlacementRule:
    """A placement rule from its spec (e.g. ``most-room``, ``prefix-affinity:0.5``)."""
    cls, values = PLACEMENTS.resolve(spec)
    return cls(**values)
