"""``fairgate bench tree``: the tenant tree and request classes under overload (docs/architecture.md).

One workload, two organisations weighted 1:3; in each, three teams of weights 1, 2 and 3: the first
with ten keys, the second with one key of the same total demand, the third with one key mixing
interactive (weight 3, a first-token objective) and batch (weight 1) requests. Two runs on the same
simulated engines:

- **overload**: every leaf asks for far more than its share. Each node's service over the measured
  window (after a warm-up) is set against its weighted max-min fair share given demand, at every
  level; the team of ten keys against the team of one; batch against its weight.
- **1.5x**: total demand 1.5x what the engines serve, interactive asking for less than its share:
  how often interactive requests meet their first-token objective, and whether batch still gets its
  max-min share.

Both runs sample every node's waiting children once a second and report the largest counter gap
between backlogged siblings against the policy's bound (2U / the smaller weight).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fairgate.core import unit_u
from fairgate.core.registry import Param
from fairgate.core.tree import TenantTree
from fairgate.loadgen.benches.base import Bench, Figures, Options, register
from fairgate.loadgen.benches.shared import sibling_gap, tree_shares
from fairgate.loadgen.simulator import Simulation, SimulationConfig
from fairgate.loadgen.workload import Workload
from fairgate.loadgen.workload_spec import workload_from_spec

ORGS = {"org-a": 1.0, "org-b": 3.0}
TEAMS = {"keys10": 1.0, "key1": 2.0, "mixed": 3.0}
CLASSES = [{"name": "interactive", "weight": 3.0, "ttft_s": 5.0}, {"name": "batch", "weight": 1.0}]
LENGTHS = {"prompt_len": [64, 512], "output_len": [64, 512]}
WARMUP = 0.2  # of the run, left out of the shares


def tree_spec(duration_s: float, team_rate: float, interactive_rate: float | None = None) -> dict[str, Any]:
    """The workload spec: every team sends ``team_rate`` req/s (a team of ten keys: a tenth each);
    the mixed key's interactive requests ``interactive_rate`` (None: as much as its batch)."""
    tree = [{"name": org, "weight": w} for org, w in ORGS.items()]
    tenants: list[dict[str, Any]] = []
    for org in ORGS:
        for team, w in TEAMS.items():
            node = f"{org}.{team}"
            tree.append({"name": node, "parent": org, "weight": w})
            if team == "keys10":
                tenants += [_tenant(f"{node}.k{i}", node, team_rate / 10) for i in range(10)]
            elif team == "key1":
                tenants.append(_tenant(f"{node}.k0", node, team_rate))
            else:
                tenants.append(_tenant(f"{node}.k0", node, team_rate, "batch"))
                tenants.append(_tenant(f"{node}.k0", node, interactive_rate or team_rate, "interactive"))
    return {"name": "tree", "duration_s": duration_s, "tree": tree, "classes": CLASSES, "tenants": tenants}


def _tenant(name: str, parent: str, rate: float, klass: str = "") -> dict[str, Any]:
    row = {"name": name, "parent": parent, "rate": rate, "arrival": "poisson", **LENGTHS}
    return row | ({"class": klass} if klass else {})


@dataclass
class TreeRun:
    """One run's per-leaf service and demand in the measured window, gaps and first-token times."""

    workload: Workload
    service: dict[str, float]  # leaf -> exact service (cost units) in the window
    demand: dict[str, float]  # leaf -> cost of what it asked for in the window
    gap_ratio: float  # largest backlogged sibling counter gap / its bound
    gap_where: str
    ttft: dict[str, list[float]]  # leaf -> first-token latencies of its requests
    capacity: float  # service per second delivered in the window
    tree: TenantTree


def run_tree(workload: Workload, replicas: int, seed: int = 42) -> TreeRun:
    config = SimulationConfig(replicas=replicas, seed=seed)
    sim = Simulation(workload, config)
    sched = sim.scheduler
    u = unit_u(config.cost, *workload.longest(), sim.kv_tokens * replicas)
    start = workload.duration_s * WARMUP
    worst, where = 0.0, ""
    at_start: list[float] | None = None
    t = 0.0
    while t < workload.duration_s:
        t += 1.0
        sim.advance(until=t)
        if at_start is None and t >= start:
            at_start = list(sim.recorder.service)
        for node in [sched.tree.root, *sched.tree.nodes.values()]:
            ratio, pair = sibling_gap(node, 2.0 * u)
            if ratio > worst:
                worst, where = ratio, f"{node.name or 'root'}: {pair}"
    rec = sim.recorder
    weights = rec.weights
    assert at_start is not None
    service = {name: (rec.service[i] - at_start[i]) * weights[i] for i, name in enumerate(rec.tenants)}
    demand = dict.fromkeys(rec.tenants, 0.0)
    ttft: dict[str, list[float]] = {name: [] for name in rec.tenants}
    total = config.cost.total
    for r in rec.requests.values():
        name = rec.tenants[r.tenant]
        if start <= r.arrival_s < workload.duration_s:
            demand[name] += total(r.prompt_tokens, r.output_target)
        if r.first_token_s is not None and r.arrival_s >= start:
            ttft[name].append(r.first_token_s - r.arrival_s)
    capacity = sum(service.values()) / (workload.duration_s - start)
    return TreeRun(workload, service, demand, worst, where, ttft, capacity, sched.tree)


def node_shares(run: TreeRun) -> list[dict[str, Any]]:
    """Every node and leaf of the run's tree against its weighted max-min fair share (``tree_shares``)."""
    return tree_shares(run.tree, run.service, run.demand, CLASSES[0]["name"])


def bench_tree(duration_s: float = 1800.0, replicas: int = 4) -> dict[str, Any]:
    """Both runs; the figures the issue names (shares within 5%, ten keys against one, batch against
    its weight, the bound per sibling pair, interactive first-token objective at 1.5x)."""
    overload = run_tree(workload_from_spec(tree_spec(duration_s, team_rate=3.0), seed=7), replicas)
    rows = node_shares(overload)
    worst = max(rows, key=lambda r: abs((r["ratio"] or 1.0) - 1.0))
    by_node = {r["node"]: r for r in rows}
    capacity_rps = overload.capacity / _mean_cost()
    # 1.5x: six teams at one rate and two interactive classes at a quarter of it (below their shares)
    team_rate = 1.5 * capacity_rps / 6.5
    paced = run_tree(
        workload_from_spec(tree_spec(duration_s, team_rate=team_rate, interactive_rate=team_rate / 4), seed=8),
        replicas,
    )
    paced_rows = {r["node"]: r for r in node_shares(paced)}
    objective = CLASSES[0]["ttft_s"]
    interactive = [x for leaf, xs in paced.ttft.items() if leaf.endswith(".mixed.k0") for x in xs]
    met = sum(1 for x in interactive if x <= objective) / len(interactive) if interactive else None
    batch = [r for name, r in paced_rows.items() if name.endswith("~batch")]
    return {
        "overload": {
            "rows": rows,
            "worst_share": {"node": worst["node"], "ratio": worst["ratio"]},
            "all_within_5pct": all(abs((r["ratio"] or 1.0) - 1.0) <= 0.05 for r in rows),
            "ten_keys_vs_one_per_weight": [
                (by_node[f"{org}.keys10"]["service"] / TEAMS["keys10"])
                / (by_node[f"{org}.key1"]["service"] / TEAMS["key1"])
                for org in ORGS
            ],
            "batch_share_of_key": [
                by_node[f"{org}.mixed.k0~batch"]["service"]
                / (by_node[f"{org}.mixed.k0~batch"]["service"] + by_node[f"{org}.mixed.k0~interactive"]["service"])
                for org in ORGS
            ],
            "gap_over_bound": overload.gap_ratio,
            "gap_where": overload.gap_where,
        },
        "paced": {
            "offered_over_capacity": _offered(paced) / overload.capacity,
            "interactive_ttft_objective_s": objective,
            "interactive_met": met,
            "interactive_requests": len(interactive),
            "batch_over_fair_share": [r["ratio"] for r in batch],
            "gap_over_bound": paced.gap_ratio,
        },
    }


def _mean_cost() -> float:
    """The mean cost of one request of LENGTHS (w_p = 1, w_q = 2)."""
    p = sum(LENGTHS["prompt_len"]) / 2
    o = sum(LENGTHS["output_len"]) / 2
    return p + 2 * o


def _offered(run: TreeRun) -> float:
    return sum(run.demand.values()) / (run.workload.duration_s * (1 - WARMUP))


def format_tree(result: Mapping[str, Any]) -> str:
    o, p = result["overload"], result["paced"]
    lines = ["Overload: each node's service against its weighted max-min fair share (1.00 = exact)"]
    lines.append(f"{'node':<34} {'parent':<16} {'weight':>6} {'service':>12} {'fair share':>12} {'ratio':>6}")
    for r in o["rows"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        indent = "  " * (r["depth"] - 1)
        lines.append(
            f"{indent + r['node']:<34} {r['parent']:<16} {r['weight']:>6g} {r['service']:>12.0f} "
            f"{r['fair_share']:>12.0f} {ratio:>6}"
        )
    tens = ", ".join(f"{v:.3f}" for v in o["ten_keys_vs_one_per_weight"])
    batch = ", ".join(f"{v:.3f}" for v in o["batch_share_of_key"])
    lines += [
        f"every node within 5% of its fair share: {o['all_within_5pct']} "
        f"(worst {o['worst_share']['node']}: {o['worst_share']['ratio']:.3f})",
        f"team of ten keys / team of one key, per unit of weight (1.00: keys earn nothing): {tens}",
        f"batch's share of its key (its weight: 0.25): {batch}",
        f"largest backlogged sibling gap / bound (2U / smaller weight): {o['gap_over_bound']:.3f} at {o['gap_where']}",
        "",
        f"Paced: offered {p['offered_over_capacity']:.2f}x capacity; interactive requests meeting their "
        f"{p['interactive_ttft_objective_s']:g} s first-token objective: "
        + ("-" if p["interactive_met"] is None else f"{100 * p['interactive_met']:.1f}%")
        + f" of {p['interactive_requests']}",
        "batch's service / its max-min fair share: " + ", ".join(f"{v:.3f}" for v in p["batch_over_fair_share"]),
        f"largest backlogged sibling gap / bound: {p['gap_over_bound']:.3f}",
    ]
    return "\n".join(lines)


@register
class TreeBench(Bench):
    """A tenant tree with request classes: per-level shares against their fair shares, the bound per
    sibling pair, the interactive class's first-token objective."""

    name = "tree"
    help = "tenant tree and request classes: per-level shares, first-token objective"
    params = (
        Param("seconds", float, 1800.0, "simulated seconds of each run"),
        Param("replicas", int, 4, "simulated engines"),
    )

    def check(self, options: Options) -> None:
        if options["seconds"] < 60 or options["replicas"] < 1:
            raise ValueError("--seconds must be at least 60 and --replicas at least 1")

    def run(self, options: Options) -> Figures:
        return {"seconds": options["seconds"], "replicas": options["replicas"]} | bench_tree(
            options["seconds"], options["replicas"]
        )

    def report(self, figures: Figures) -> str:
        return (
            "two organisations 1:3, three teams each (weights 1, 2, 3: ten keys, one key, one key mixing "
            f"interactive 3 : batch 1), {figures['replicas']} simulated A10G engines, {figures['seconds']:g} "
            "simulated s per run\n" + format_tree(figures)
        )
