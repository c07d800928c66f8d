"""Figures several benches report alike: a run's service row, the worst gap between siblings of a tree
node against its bound, and every tree member's service against its weighted max-min fair share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairgate.core.fairness import max_min_shares
from fairgate.core.tree import TenantTree, TreeNode


def service_row(report: dict[str, Any], seconds: float) -> dict[str, Any]:
    """A run's figures for a side-by-side bench: tokens/s, each tenant's service rate and share, and
    the largest backlogged gap against the bound."""
    tenants = report["tenants"]
    total = sum(t["service"] for t in tenants.values()) or 1.0
    return {
        "throughput_tokens_per_s": report["throughput_tokens_per_s"],
        "service_per_s": {name: t["service"] / seconds for name, t in tenants.items()},
        "share": {name: t["service"] / total for name, t in tenants.items()},
        "max_backlogged_gap": report["max_abs_service_diff"],
        "bound": report["bound_2u"],
        "bound_held": report["bound_held"],
    }


def sibling_gap(node: TreeNode, bound: float) -> tuple[float, str]:
    """The largest |c_f - c_g| x min(w_f, w_g) / bound among the backlogged children of ``node``."""
    members = [node.kids[name] for name, _ in node.waiting.entries()]
    worst, pair = 0.0, ""
    for i, f in enumerate(members):
        for g in members[i + 1 :]:
            ratio = abs(f.counter - g.counter) * min(f.weight, g.weight) / bound
            if ratio > worst:
                worst, pair = ratio, f"{f.name} / {g.name}"
    return worst, pair


def tree_shares(
    tree: TenantTree, service: Mapping[str, float], demand: Mapping[str, float], default_class: str
) -> list[dict[str, Any]]:
    """Every node and leaf of ``tree``: its service, its weighted max-min fair share given its
    subtree's demand (water-filled level by level from the root, each node sharing what it got), and
    their ratio. A key's default-class leaf is shown as ``key~default_class``."""
    rows: list[dict[str, Any]] = []

    def total(member: Any, table: Mapping[str, float]) -> float:
        if type(member) is TreeNode:
            return sum(total(kid, table) for kid in member.kids.values())
        return table.get(member.name, 0.0)

    def label(member: Any, parent: TreeNode) -> str:
        if type(member) is not TreeNode and parent.implicit and member.name == parent.name:
            return f"{member.name}~{default_class}"
        return member.name

    def fill(node: TreeNode, allocation: float, depth: int) -> None:
        kids = list(node.kids.values())
        demands = [total(k, demand) for k in kids]
        shares, _ = max_min_shares(demands, [k.weight for k in kids], allocation)
        for kid, owed in zip(kids, shares, strict=True):
            got = total(kid, service)
            rows.append(
                {
                    "node": label(kid, node),
                    "name": kid.name,
                    "leaf": type(kid) is not TreeNode,
                    "parent": node.name or "root",
                    "depth": depth,
                    "weight": kid.weight,
                    "service": got,
                    "fair_share": owed,
                    "ratio": got / owed if owed else None,
                }
            )
            if type(kid) is TreeNode:
                fill(kid, got, depth + 1)

    fill(tree.root, sum(service.values()), 1)
    return rows
