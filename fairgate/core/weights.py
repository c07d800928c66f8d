"""What a weight may be, stated once: the core, the configuration, the admin API and the tenant registry
all refuse the same weights with the same words."""

from __future__ import annotations

MAX_WEIGHT = 1e6  # a weight past this would let one tenant's counter stand still against everyone's


def weight_problem(weight: object) -> str | None:
    """None for a usable weight (a number, > 0 and <= ``MAX_WEIGHT``); else the phrase that says why not."""
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight <= MAX_WEIGHT:
        return f"weight must be positive and at most {MAX_WEIGHT:g}, got {weight!r}"
    return None
