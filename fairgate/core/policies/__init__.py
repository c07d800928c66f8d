"""Fairness policies as plug-ins: one module per policy in this package, registered by name.

A policy decides which waiting request is served next and who may queue at all; the scheduler does
everything else (queues, charging through the ledger, placement, capacity). Adding a policy is adding
one module here with a ``FairnessPolicy`` subclass decorated with ``@register``: it is found by name
(``make_policy("name[:arg]")``), listed in the command line's help, and run through the conformance
suite (``tests/unit/test_policy_conformance.py``) like every other policy.
"""

from __future__ import annotations

from fairgate.core.policies.base import POLICIES, FairnessPolicy, register
from fairgate.core.registry import discover

__all__ = ["FairnessPolicy", "make_policy", "policy_examples", "policy_names", "policy_usages", "register"]

discover(__name__, __path__)


def policy_names() -> list[str]:
    return POLICIES.names()


def policy_usages() -> list[str]:
    """How each policy is written (e.g. ``rpm:N``), for help texts and errors."""
    return [POLICIES[name].usage for name in POLICIES.names()]


def policy_examples() -> list[str]:
    """A spec of every registered policy (several where a parameter changes its behaviour)."""
    return [spec for name in POLICIES.names() for spec in POLICIES[name].examples or (name,)]


def make_policy(spec: str, seed: int = 0) -> FairnessPolicy:
    """A fresh policy from its spec: ``name`` or ``name:argument`` (e.g. ``vtc``, ``rpm:5``)."""
    text = str(spec).strip().lower()
    name, _, arg = text.partition(":")
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown policy {spec!r} (expected one of: {', '.join(policy_usages())})")
    return cls.from_arg(arg if ":" in text else None, seed)
