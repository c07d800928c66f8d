"""``fairgate bench slo``: a class's first-token objective enforced at 2x overload, side by side with
queueing it (today's behaviour) on the same traffic (docs/objectives.md).

The tree: two organisations of weight 1. ``org-a``'s key ``app`` sends interactive requests (weight 3,
a 2 s first-token objective, short) and batch requests (weight 1); ``org-b``'s key ``etl`` sends batch
requests only. Offered load: interactive 0.3, app's batch 0.6 and etl 1.1 of what the engines serve.
One run per arm, each on the same workload and seed; the engines rank preemption victims by the
dispatcher's priority (vLLM's priority scheduling). Measured after a warm-up:

- ``attainment``: of the interactive requests admitted in their class, the share whose first token
  came within the objective (a request still waiting at the end counts as a miss once its objective
  has passed);
- ``shed_answer_ms_p99``: the dispatcher's decision time for the requests it shed (wall-clock
  milliseconds of ``submit``, which answers them; the simulated clock answers them at their arrival);
- ``batch_share_of_fair``: per batch leaf, its service over its weighted max-min fair share of the
  tree given every leaf's demand, interactive's demand being what it was served (so that what is
  left after interactive is shared fairly; below 1: interactive bought latency with batch's share);
- the largest backlogged sibling gap against VTC's bound (2U over the smaller weight), plus one
  request's cost where urgent requests may go that far ahead of their turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fairgate.core import unit_u
from fairgate.core.reasons import REJECT_OBJECTIVE
from fairgate.core.registry import Param
from fairgate.loadgen.benches.base import Bench, Figures, Options, names, register
from fairgate.loadgen.benches.shared import sibling_gap, tree_shares
from fairgate.loadgen.metrics import quantile
from fairgate.loadgen.simulator import Simulation, SimulationConfig
from fairgate.loadgen.workload import Workload
from fairgate.loadgen.workload_spec import workload_from_spec

OBJECTIVE_S = 2.0
INTERACTIVE = {"prompt_len": [64, 192], "output_len": [64, 192]}
BATCH = {"prompt_len": [64, 512], "output_len": [64, 512]}
OFFERED = {"interactive": 0.3, "app_batch": 0.6, "etl": 1.1}  # of capacity: 2.0x in all
ARMS = ("queue", "shed", "downgrade")
WARMUP_S = 60.0
FLOOD_CAPACITY = 5000.0  # cost units/s the capacity run assumes: several times what one engine serves


def slo_spec(duration_s: float, capacity: float, on_miss: str) -> dict[str, Any]:
    """The workload spec at ``capacity`` cost units/s, the interactive class's ``on_miss`` given."""
    interactive: dict[str, Any] = {"name": "interactive", "weight": 3.0, "ttft_s": OBJECTIVE_S, "on_miss": on_miss}
    if on_miss == "downgrade":
        interactive["downgrade_to"] = "batch"
    rate = {key: share * capacity for key, share in OFFERED.items()}
    tenants = [
        _tenant("app", "org-a", rate["interactive"] / _mean_cost(INTERACTIVE), INTERACTIVE, "interactive"),
        _tenant("app", "org-a", rate["app_batch"] / _mean_cost(BATCH), BATCH, "batch"),
        _tenant("etl", "org-b", rate["etl"] / _mean_cost(BATCH), BATCH, "batch"),
    ]
    return {
        "name": f"slo-{on_miss}",
        "duration_s": duration_s,
        "tree": [{"name": "org-a", "weight": 1.0}, {"name": "org-b", "weight": 1.0}],
        "classes": [interactive, {"name": "batch", "weight": 1.0}],
        "tenants": tenants,
    }


def _tenant(name: str, parent: str, rate: float, lengths: Mapping[str, Any], klass: str) -> dict[str, Any]:
    return {"name": name, "parent": parent, "rate": rate, "arrival": "poisson", "class": klass, **lengths}


def _mean_cost(lengths: Mapping[str, list[int]]) -> float:
    """The mean cost of one request of uniform ``lengths`` (w_p = 1, w_q = 2)."""
    return sum(lengths["prompt_len"]) / 2 + 2 * sum(lengths["output_len"]) / 2


def _config(seed: int) -> SimulationConfig:
    return SimulationConfig(replicas=1, seed=seed, preempt_by="priority")


def measure_capacity(seed: int, seconds: float = 120.0) -> float:
    """Cost units per second one engine serves this mix when flooded with it (objectives queued)."""
    flood = slo_spec(seconds, FLOOD_CAPACITY, "queue")
    sim = Simulation(workload_from_spec(flood, seed=seed), _config(seed))
    sim.advance(until=seconds / 4)
    before = sim.scheduler.ledger.total
    sim.advance(until=seconds)
    return (sim.scheduler.ledger.total - before) / (seconds * 3 / 4)


@dataclass
class Outcomes:
    """What the dispatcher answered each request at submission, and how long the answer took."""

    outcome: dict[str, str]  # request id -> admitted, shed, downgraded, rejected
    shed_ms: list[float]


def _watch_submissions(sim: Simulation) -> Outcomes:
    """Wrap the scheduler's ``submit`` so that each answer and its wall time are kept (the bench's own
    instrument: the simulator calls the same method)."""
    sched, seen = sim.scheduler, Outcomes({}, [])
    submit: Callable[..., str | None] = sched.submit
    records = sched.waits.records

    def watched(request_id: str, *args: Any, **kwargs: Any) -> str | None:
        downgraded = sum(r.downgraded for r in records.values())
        started = time.perf_counter()
        reason = submit(request_id, *args, **kwargs)
        elapsed_ms = 1000.0 * (time.perf_counter() - started)
        if reason == REJECT_OBJECTIVE:
            seen.outcome[request_id] = "shed"
            seen.shed_ms.append(elapsed_ms)
        elif reason is not None:
            seen.outcome[request_id] = "rejected"
        elif sum(r.downgraded for r in records.values()) > downgraded:
            seen.outcome[request_id] = "downgraded"
        else:
            seen.outcome[request_id] = "admitted"
        return reason

    sched.submit = watched  # type: ignore[method-assign]
    return seen


def run_arm(workload: Workload, seed: int) -> dict[str, Any]:
    """One arm: the workload through one simulated engine, sampled once a second."""
    config = _config(seed)
    sim = Simulation(workload, config)
    seen = _watch_submissions(sim)
    sched = sim.scheduler
    two_u = 2.0 * unit_u(config.cost, *workload.longest(), sim.kv_tokens * config.replicas)
    one_request = config.cost.total(*workload.longest())
    enforced = any(c.enforced for c in workload.classes)
    bound = two_u + (one_request if enforced else 0.0)
    worst, where, t = 0.0, "", 0.0
    service_at_start: dict[str, float] = {}
    while t < workload.duration_s:
        t += 1.0
        sim.advance(until=t)
        if not service_at_start and t >= WARMUP_S:
            service_at_start = {name: leaf.service for name, leaf in sched.tenants.items()}
        for node in [sched.tree.root, *sched.tree.nodes.values()]:
            ratio, pair = sibling_gap(node, bound)
            if ratio > worst:
                worst, where = ratio, f"{node.name or 'root'}: {pair}"
    window = workload.duration_s - WARMUP_S
    service = {name: leaf.service - service_at_start.get(name, 0.0) for name, leaf in sched.tenants.items()}
    return {
        **_interactive(sim, seen, workload.duration_s),
        "throughput": sum(service.values()) / window,
        "service_per_leaf": service,
        "shares": _batch_shares(sim, service, workload.duration_s),
        "gap_over_bound": worst,
        "gap_where": where,
        "bound": bound,
    }


def _interactive(sim: Simulation, seen: Outcomes, end: float) -> dict[str, Any]:
    """The interactive class's requests after the warm-up: what they were answered and how many of
    those admitted in their class met the objective."""
    counts = dict.fromkeys(("offered", "admitted", "shed", "downgraded", "met"), 0)
    interactive = sim.scheduler.class_leaf("app", "interactive").name
    waits: list[float] = []
    for rid, r in sim.recorder.requests.items():
        if sim.recorder.tenants[r.tenant] != interactive or r.arrival_s < WARMUP_S:
            continue
        counts["offered"] += 1
        outcome = seen.outcome.get(rid, "admitted")
        if outcome != "admitted":
            counts[outcome if outcome in counts else "shed"] += 1
            continue
        if r.first_token_s is None and r.arrival_s + OBJECTIVE_S > end:
            counts["offered"] -= 1  # its objective had not passed when the run ended: not judged
            continue
        counts["admitted"] += 1
        wait = (r.first_token_s if r.first_token_s is not None else end) - r.arrival_s
        waits.append(wait)
        counts["met"] += wait <= OBJECTIVE_S
    waits.sort()
    shed_ms = sorted(seen.shed_ms)
    return {
        **counts,
        "attainment": counts["met"] / counts["admitted"] if counts["admitted"] else None,
        "attainment_of_offered": counts["met"] / counts["offered"] if counts["offered"] else None,
        "ttft_p50_s": quantile(waits, 0.5),
        "ttft_p99_s": quantile(waits, 0.99),
        "shed_answer_ms_p99": quantile(shed_ms, 0.99),
        "objective_views": {k: dict(v) for k, v in sim.scheduler.waits.views().items()},
    }


def _batch_shares(sim: Simulation, service: Mapping[str, float], end: float) -> list[dict[str, Any]]:
    """Each batch leaf's service against its weighted max-min fair share of the tree, every leaf's
    demand in the window given (interactive's: what it was served), water-filled from the root."""
    sched, rec, total = sim.scheduler, sim.recorder, sim.config.cost.total
    interactive = sched.class_leaf("app", "interactive").name
    demand = dict.fromkeys(service, 0.0)
    for r in rec.requests.values():
        name = rec.tenants[r.tenant]
        if WARMUP_S <= r.arrival_s < end and name != interactive:
            demand[name] = demand.get(name, 0.0) + total(r.prompt_tokens, r.output_target)
    demand[interactive] = service.get(interactive, 0.0)
    rows = tree_shares(sched.tree, service, demand, sched.book.default_class)
    return [
        {"leaf": r["name"], "service": r["service"], "fair_share": r["fair_share"], "ratio": r["ratio"]}
        for r in rows
        if r["leaf"] and r["name"] != interactive and (demand.get(r["name"]) or service.get(r["name"]))
    ]


def bench_slo(duration_s: float = 900.0, seed: int = 3, arms: tuple[str, ...] = ARMS) -> dict[str, Any]:
    """Every arm on the same workload at 2x the measured capacity; the issue's figures per arm."""
    capacity = measure_capacity(seed)
    result: dict[str, Any] = {"capacity": capacity, "objective_s": OBJECTIVE_S, "offered": OFFERED, "arms": {}}
    for arm in arms:
        run = run_arm(workload_from_spec(slo_spec(duration_s, capacity, arm), seed=seed), seed)
        ratios = [row["ratio"] for row in run["shares"] if row["ratio"] is not None]
        run["batch_share_of_fair"] = min(ratios) if ratios else None
        result["arms"][arm] = run
    return result


def format_slo(result: Mapping[str, Any]) -> str:
    lines = [
        f"one simulated A10G engine, {result['capacity']:.0f} cost units/s; offered 2.0x "
        f"(interactive {OFFERED['interactive']}, app's batch {OFFERED['app_batch']}, etl {OFFERED['etl']}); "
        f"objective {result['objective_s']:g} s",
        f"{'arm':<10} {'offered':>7} {'admitted':>8} {'shed':>6} {'downgr':>6} {'attain':>7} {'of all':>7} "
        f"{'p50 s':>6} {'p99 s':>6} {'shed ms p99':>11} {'batch/fair':>10} {'cost/s':>7} {'gap/bound':>9}",
    ]
    for arm, r in result["arms"].items():
        lines.append(
            f"{arm:<10} {r['offered']:>7} {r['admitted']:>8} {r['shed']:>6} {r['downgraded']:>6} "
            f"{_pct(r['attainment']):>7} {_pct(r['attainment_of_offered']):>7} {_num(r['ttft_p50_s']):>6} "
            f"{_num(r['ttft_p99_s']):>6} {_num(r['shed_answer_ms_p99'], 3):>11} "
            f"{_num(r['batch_share_of_fair'], 3):>10} "
            f"{r['throughput']:>7.0f} {r['gap_over_bound']:>9.3f}"
        )
    lines.append("batch leaves' service / fair share of what interactive left:")
    for arm, r in result["arms"].items():
        lines.append(f"  {arm}: " + ", ".join(f"{row['leaf']} {_num(row['ratio'], 3)}" for row in r["shares"]))
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


@register
class SloBench(Bench):
    """An interactive class's first-token objective at 2x overload: enforced (shed, downgrade) beside
    queueing, one simulated engine."""

    name = "slo"
    help = "first-token objectives enforced at 2x overload, side by side with queueing"
    params = (
        Param("seconds", float, 1800.0, "simulated seconds of each arm"),
        Param("seed", int, 3, "the workload's seed (every arm the same)"),
        Param("arms", str, ",".join(ARMS), "comma-separated: " + ", ".join(ARMS)),
    )

    def check(self, options: Options) -> None:
        names(options["arms"], "--arms", ARMS)
        if options["seconds"] < 2 * WARMUP_S:
            raise ValueError(f"--seconds must be at least {2 * WARMUP_S:g}")

    def run(self, options: Options) -> Figures:
        return bench_slo(options["seconds"], options["seed"], names(options["arms"], "--arms", ARMS))

    def report(self, figures: Figures) -> str:
        return format_slo(figures)
