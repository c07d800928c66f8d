"""Fairness policies as plug-ins: one module per policy in this package, registered by name.

A policy decides which waiting request is served next and who may queue at all; the scheduler does
everything else (queues, charging through the ledger, placement, capacity). Adding a policy is adding
one module here with a ``FairnessPolicy`` subclass decorated with ``@register``: it is found by name
and built from a spec as every plug-in is (``fairgate.core.registry``: ``make_policy("rpm:5")`` or
``make_policy({"name": "rpm", "limit": 5})``), listed in the command line's help and the reference,
and run through the conformance suite (``tests/unit/test_policy_conformance.py``) like every other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairgate.core.policies.base import POLICIES, FairnessPolicy, register
from fairgate.core.registry import discover

__all__ = ["FairnessPolicy", "make_policy", "policy_examples", "policy_names", "policy_usages", "register"]

discover(__name__, __path__)


def policy_names() -> list[str]:
    return POLICIES.names()


def policy_usages() -> list[str]:
    """How each policy is written (e.g. ``rpm:LIMIT``), for help texts and errors."""
    return POLICIES.usages()


def policy_examples() -> list[str]:
    """A spec of every registered policy (several where a parameter changes its behaviour)."""
    return [spec for name in POLICIES.names() for spec in POLICIES[name].examples or (name,)]


def make_policy(spec: str | Mapping[str, Any], seed: int = 0) -> FairnessPolicy:
    """A fresh policy from its spec (e.g. ``vtc``, ``rpm:5``, ``{name: vtc-locality, slack: 500}``)."""
    cls, values = POLICIES.resolve(spec)
    return cls(seed, **values)
