"""Fairness and performance metrics, from exactly what was served.

``ServiceRecorder`` is fed what each engine step produced (prompt tokens prefilled, output tokens
generated, per request) and samples every tenant's cumulative service and backlog state after each
decision point. ``summarize`` turns that into the report's figures: the largest service difference
over any interval in which two tenants were both backlogged, against the 2U bound; service rates;
first-token and end-to-end latency; throughput; Jain's index; rejections.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fairgate.core.costs import CostFunction, ProfiledCost
from fairgate.core.fairness import fair_share_jain, max_min_shares

WINDOW_S = 60.0
# The paper's profiled h is A10G engine milliseconds per request at full batch. Summed over what was
# served it measures work done in engine time, whatever the mix of prompt and output lengths: tokens/s
# alone rewards a policy for serving prefill-heavy requests, which are cheaper per token.
_ENGINE_TIME_MS = ProfiledCost()


@dataclass(slots=True)
class RequestRecord:
    """One request as measured: when it came, how long it was meant to be, what was served and when."""

    tenant: int  # index into the recorder's tenants
    arrival_s: float
    prompt_tokens: int  # the engine's exact count once it started
    output_target: int  # the workload's output length (its demand)
    generated: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None
    rejected: bool = False


@dataclass
class ServiceRecorder:
    """Collects the exact service of every tenant while a run goes on (simulated or measured)."""

    tenants: list[str]
    weights: list[float]
    cost: CostFunction
    requests: dict[str, RequestRecord] = field(default_factory=dict)
    sample_times: list[float] = field(default_factory=list)
    sample_service: list[list[float]] = field(default_factory=list)
    sample_backlog: list[list[bool]] = field(default_factory=list)
    rejections: list[tuple[int, float, bool]] = field(default_factory=list)  # tenant, time, capacity idle
    prompt_tokens_served: int = 0
    output_tokens_served: int = 0
    cached_tokens_served: int = 0  # prompt tokens the engines found in their prefix caches
    charge_cached: bool = True  # service counts cached tokens at w_c (False: as the prefix-blind dispatcher does)

    def __post_init__(self) -> None:
        self.index = {name: i for i, name in enumerate(self.tenants)}
        self.service = [0.0] * len(self.tenants)  # weighted: cost / weight
        self.tenant_prompt = [0] * len(self.tenants)
        self.tenant_cached = [0] * len(self.tenants)

    def on_arrival(self, request_id: str, tenant: str, arrival_s: float, prompt: int, output: int) -> None:
        self.requests[request_id] = RequestRecord(self.index[tenant], arrival_s, prompt, output)

    def on_reject(self, request_id: str, now: float, capacity_idle: bool) -> None:
        rec = self.requests[request_id]
        rec.rejected = True
        self.rejections.append((rec.tenant, now, capacity_idle))

    def on_step(
        self,
        now: float,
        started: dict[str, int],
        new_tokens: dict[str, int],
        finished: Sequence[str],
        cached: dict[str, int] | None = None,
    ) -> None:
        """One engine step ended at ``now``: charge what it really did to each tenant (a prompt's
        tokens found in the prefix cache at ``w_c``, ``cached``)."""
        total, discount = self.cost.total, self.cost.cached_discount
        service, weights, requests = self.service, self.weights, self.requests
        cached = cached or {}
        for rid, prompt in started.items():
            rec = requests[rid]
            rec.prompt_tokens = prompt
            hit = cached.get(rid, 0)
            service[rec.tenant] += (total(prompt, 0) - (discount(hit) if self.charge_cached else 0.0)) / weights[
                rec.tenant
            ]
            self.prompt_tokens_served += prompt
            self.tenant_prompt[rec.tenant] += prompt
            self._count_cached(rec.tenant, hit)
        for rid, k in new_tokens.items():
            rec = requests[rid]
            old = rec.generated
            rec.generated = old + k
            if old == 0:
                rec.first_token_s = now
            service[rec.tenant] += (total(rec.prompt_tokens, old + k) - total(rec.prompt_tokens, old)) / weights[
                rec.tenant
            ]
            self.output_tokens_served += k
        for rid in finished:
            requests[rid].finish_s = now

    def on_cache_report(self, request_id: str, cached: int) -> None:
        """A client learns a prompt's prefix-cache hit only from the final usage, after the prompt was
        charged: count it for the hit rate (so only finished requests' hits count), leave the charge."""
        self._count_cached(self.requests[request_id].tenant, cached)

    def _count_cached(self, tenant: int, cached: int) -> None:
        self.cached_tokens_served += cached
        self.tenant_cached[tenant] += cached

    def sample(self, now: float, backlogged: list[bool]) -> None:
        self.sample_times.append(now)
        self.sample_service.append(self.service.copy())
        self.sample_backlog.append(backlogged)


@dataclass
class RunSummary:
    """The report's entry for one run, and the time series its plots draw."""

    report: dict[str, Any]
    series: dict[str, Any]


def quantile(ordered: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of ``ordered`` (sorted), nearest rank below; None when empty."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def summarize(
    rec: ServiceRecorder,
    *,
    workload: str,
    policy: str,
    replicas: int,
    kv_tokens: int,
    duration_s: float,
    bound: float,
    siblings: list[Siblings] | None = None,
) -> RunSummary:
    """The run's report and plot series. ``siblings``: the tenant tree's nodes, each with its children
    (the leaves under each, their weights): the bound is then checked per sibling pair at every level
    (leaves of different parents are not compared); None: every pair of tenants, as in a flat tree."""
    times = np.asarray(rec.sample_times, dtype=float)
    service = np.asarray(rec.sample_service, dtype=float).reshape(len(times), len(rec.tenants))
    backlog = np.asarray(rec.sample_backlog, dtype=bool).reshape(len(times), len(rec.tenants))
    weights = np.asarray(rec.weights, dtype=float)
    pair_diff, worst_pair = _max_backlogged_diffs(service, backlog)
    held = all(d <= bound / min(weights[f], weights[g]) + 1e-6 for (f, g), d in pair_diff.items())
    levels = None if siblings is None else _sibling_bounds(service * weights, backlog, siblings, bound)
    if levels is not None:
        held = all(row["held"] for row in levels.values())
    max_diff = max(pair_diff.values(), default=0.0)
    raw_service = service[-1] * weights if len(times) else np.zeros(len(rec.tenants))
    demand = _demand(rec, duration_s)
    capacity = float(raw_service.sum())
    owed, level = _max_min_fair(demand, weights, capacity)
    if siblings is not None:  # a tree: what each leaf is owed comes down the tree, level by level
        owed = _tree_owed(siblings, demand, capacity, rec.tenants)
    under_share = [bool(0 < d < level * w) for d, w in zip(demand, weights, strict=True)]
    ttft, e2e, unstarted = _latencies(rec, duration_s)
    tenants_report: dict[str, Any] = {}
    for i, name in enumerate(rec.tenants):
        t_ttft, t_e2e = ttft[i], e2e[i]
        tenants_report[name] = {
            "weight": float(weights[i]),
            "service": float(raw_service[i]),
            "requests": sum(1 for r in rec.requests.values() if r.tenant == i),
            "rejected": sum(1 for t, _, _ in rec.rejections if t == i),
            "unstarted": unstarted[i],
            "mean_ttft_s": _mean(t_ttft),
            "p50_ttft_s": _pct(t_ttft, 50),
            "p99_ttft_s": _pct(t_ttft, 99),
            "mean_latency_s": _mean(t_e2e),
            "p99_latency_s": _pct(t_e2e, 99),
            "under_share": under_share[i],
            "prefix_hit_rate": _ratio(rec.tenant_cached[i], rec.tenant_prompt[i]),
            "service_rate_per_window": _window_rates(times, service[:, i] * weights[i], duration_s),
        }
    under_ttft = [x for i in range(len(rec.tenants)) if under_share[i] for x in ttft[i]]
    windowed = _windowed_diffs(times, service, backlog, duration_s)
    tokens = rec.prompt_tokens_served + rec.output_tokens_served
    engine_ms = sum(_ENGINE_TIME_MS.total(r.prompt_tokens, r.generated) for r in rec.requests.values() if r.generated)
    report = {
        "workload": workload,
        "policy": policy,
        "replicas": replicas,
        "kv_tokens": kv_tokens,
        "duration_s": duration_s,
        "throughput_tokens_per_s": tokens / duration_s,
        "work_per_s": engine_ms / duration_s,
        "output_tokens_per_s": rec.output_tokens_served / duration_s,
        "requests_finished": sum(1 for r in rec.requests.values() if r.finish_s is not None),
        "prompt_tokens": rec.prompt_tokens_served,
        "output_tokens": rec.output_tokens_served,
        "cached_tokens": rec.cached_tokens_served,
        "prefix_hit_rate": _ratio(rec.cached_tokens_served, rec.prompt_tokens_served),
        "max_abs_service_diff": max_diff,
        "max_diff_pair": [rec.tenants[worst_pair[0]], rec.tenants[worst_pair[1]]] if worst_pair else None,
        "bound_2u": bound / float(weights.min()) if len(weights) else bound,
        "bound_held": held,
        "avg_windowed_service_diff": windowed[0],
        "max_windowed_service_diff": windowed[1],
        "jain_index": _jain(raw_service, owed),
        "under_share_mean_ttft_s": _mean(under_ttft),
        "rejected": len(rec.rejections),
        "rejected_while_idle": sum(1 for _, _, idle in rec.rejections if idle),
        "tenants": tenants_report,
    }
    if levels is not None:
        report["siblings"] = levels
    done = [r for r in rec.requests.values() if r.finish_s is not None]
    series = {
        "tenants": rec.tenants,
        "rate_times": [],
        "rates": [],
        "gap_times": [],
        "gap": [],
        # response time of the requests that finished, by arrival time
        "arrivals": [[r.arrival_s for r in done if r.tenant == i] for i in range(len(rec.tenants))],
        "latency": [[r.finish_s - r.arrival_s for r in done if r.tenant == i] for i in range(len(rec.tenants))],
    }
    if len(times):
        grid = np.arange(WINDOW_S, max(duration_s, WINDOW_S) + 1e-9, 5.0)
        series["rate_times"] = grid.tolist()
        series["rates"] = [
            (
                (_at(times, service[:, i], grid) - _at(times, service[:, i], grid - WINDOW_S)) * weights[i] / WINDOW_S
            ).tolist()
            for i in range(len(rec.tenants))
        ]
        if worst_pair:
            series["gap_times"], series["gap"] = _gap_series(times, service, backlog, worst_pair)
    return RunSummary(report, series)


# ---------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class Siblings:
    """One tree node's children: each child's name, weight and the recorder's indices of its leaves."""

    node: str
    names: list[str]
    weights: list[float]
    leaves: list[list[int]]


def _sibling_bounds(raw: np.ndarray, backlog: np.ndarray, siblings: list[Siblings], bound: float) -> dict[str, Any]:
    """Per node: the largest weighted service gap between two of its children over an interval in
    which both stayed backlogged (a child is backlogged while any leaf under it is), against the
    bound / the smaller weight."""
    out: dict[str, Any] = {}
    for group in siblings:
        if len(group.names) < 2:
            continue
        child_service = np.stack(
            [raw[:, leaves].sum(axis=1) / w for leaves, w in zip(group.leaves, group.weights, strict=True)], axis=1
        )
        child_backlog = np.stack([backlog[:, leaves].any(axis=1) for leaves in group.leaves], axis=1)
        diffs, _ = _max_backlogged_diffs(child_service, child_backlog)
        ratios = {p: d * min(group.weights[p[0]], group.weights[p[1]]) / bound for p, d in diffs.items()}
        top = max(ratios, key=ratios.get, default=None)  # type: ignore[arg-type]
        out[group.node or "root"] = {
            "max_gap_over_bound": ratios[top] if top else 0.0,
            "pair": [group.names[top[0]], group.names[top[1]]] if top else None,
            "held": all(r <= 1.0 + 1e-9 for r in ratios.values()),
        }
    return out


def _max_backlogged_diffs(service: np.ndarray, backlog: np.ndarray) -> tuple[dict[tuple[int, int], float], Any]:
    """For each pair, the largest |W_f − W_g| over an interval in which both stayed backlogged: within
    each run of samples where both are backlogged, max(D) − min(D) of D = S_f − S_g."""
    out: dict[tuple[int, int], float] = {}
    worst: tuple[int, int] | None = None
    n = service.shape[1]
    active = [i for i in range(n) if backlog[:, i].any()]
    for a_pos, f in enumerate(active):
        for g in active[a_pos + 1 :]:
            idx = np.flatnonzero(backlog[:, f] & backlog[:, g])
            if len(idx) < 2:
                continue
            d = service[idx, f] - service[idx, g]
            starts = np.flatnonzero(np.diff(idx, prepend=-2) != 1)
            spread = float((np.maximum.reduceat(d, starts) - np.minimum.reduceat(d, starts)).max())
            out[(f, g)] = spread
            if worst is None or spread > out[worst]:
                worst = (f, g)
    return out, worst


def _gap_series(times: np.ndarray, service: np.ndarray, backlog: np.ndarray, pair: tuple[int, int]):
    """The worst interval gap ending at each moment, for the pair with the largest difference."""
    f, g = pair
    both = backlog[:, f] & backlog[:, g]
    d = service[:, f] - service[:, g]
    gap = np.zeros(len(times))
    idx = np.flatnonzero(both)
    if len(idx):
        for seg in np.split(idx, np.flatnonzero(np.diff(idx) != 1) + 1):
            ds = d[seg]
            gap[seg] = np.maximum(ds - np.minimum.accumulate(ds), np.maximum.accumulate(ds) - ds)
    step = max(1, len(times) // 4000)  # enough points for a plot
    return times[::step].tolist(), gap[::step].tolist()


def _at(times: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """A step function's value (last sample at or before each time; 0 before the first)."""
    pos = np.searchsorted(times, at, side="right") - 1
    return np.where(pos >= 0, values[np.clip(pos, 0, None)], 0.0)


def _window_rates(times: np.ndarray, cumulative: np.ndarray, duration_s: float) -> list[float]:
    if not len(times):
        return []
    edges = np.arange(0.0, duration_s + 1e-9, WINDOW_S)
    if edges[-1] < duration_s:
        edges = np.append(edges, duration_s)
    values = _at(times, cumulative, edges)
    return (np.diff(values) / np.diff(edges)).tolist()


def _windowed_diffs(times: np.ndarray, service: np.ndarray, backlog: np.ndarray, duration_s: float):
    """Average and largest spread of service among tenants backlogged for at least half of a 60 s
    window (windows slide by 10 s); windows with fewer than two such tenants are skipped."""
    if len(times) < 2:
        return 0.0, 0.0
    dt = np.diff(times, append=times[-1])
    backlog_time = np.vstack([np.zeros(service.shape[1]), np.cumsum(backlog * dt[:, None], axis=0)])
    bt_times = np.concatenate([[times[0]], times + dt])
    diffs = []
    for start in np.arange(0.0, max(duration_s - WINDOW_S, 0.0) + 1e-9, 10.0):
        end = start + WINDOW_S
        frac = (_interp_cum(bt_times, backlog_time, end) - _interp_cum(bt_times, backlog_time, start)) / WINDOW_S
        members = np.flatnonzero(frac >= 0.5)
        if len(members) < 2:
            continue
        got = _at(times, service, np.array([end]))[0] - _at(times, service, np.array([start]))[0]
        got = got[members]
        diffs.append(float(got.max() - got.min()))
    if not diffs:
        return 0.0, 0.0
    return float(np.mean(diffs)), float(np.max(diffs))


def _interp_cum(times: np.ndarray, cumulative: np.ndarray, at: float) -> np.ndarray:
    return np.array([np.interp(at, times, cumulative[:, i]) for i in range(cumulative.shape[1])])


def _demand(rec: ServiceRecorder, duration_s: float) -> np.ndarray:
    """Cost per second each tenant asked for (requests that arrived within the run)."""
    demand = np.zeros(len(rec.tenants))
    for r in rec.requests.values():
        if r.arrival_s <= duration_s:
            demand[r.tenant] += rec.cost.total(r.prompt_tokens, r.output_target)
    return demand


def _tree_owed(siblings: list[Siblings], demand: np.ndarray, capacity: float, names: list[str]) -> np.ndarray:
    """Each leaf's weighted max-min fair share given demand in a tree: the root's capacity water-filled
    among its children by their subtrees' demand, each child's share among its own, and so on."""
    groups = {g.node: g for g in siblings}
    owed = np.zeros(len(demand))

    def fill(group: Siblings, allocation: float) -> None:
        asked = [float(demand[leaves].sum()) for leaves in group.leaves]
        shares, _ = max_min_shares(asked, group.weights, allocation)
        for name, leaves, share in zip(group.names, group.leaves, shares, strict=True):
            inner = groups.get(name)
            if inner is not None and not (len(leaves) == 1 and names[leaves[0]] == name):
                fill(inner, share)
            elif leaves:
                owed[leaves[0]] += share

    fill(groups[""], capacity)
    return owed


def _max_min_fair(demand: np.ndarray, weights: np.ndarray, capacity: float) -> tuple[np.ndarray, float]:
    alloc, level = max_min_shares(demand.tolist(), weights.tolist(), capacity)
    return np.asarray(alloc, dtype=float), level


def _jain(service: np.ndarray, owed: np.ndarray) -> float:
    return fair_share_jain(service.tolist(), owed.tolist())


def _latencies(rec: ServiceRecorder, duration_s: float):
    """First-token and end-to-end latencies per tenant. A request still waiting at the end counts
    with its wait so far (a lower bound), so a policy that starves someone cannot hide it."""
    n = len(rec.tenants)
    ttft: list[list[float]] = [[] for _ in range(n)]
    e2e: list[list[float]] = [[] for _ in range(n)]
    unstarted = [0] * n
    for r in rec.requests.values():
        if r.rejected or r.arrival_s > duration_s:
            continue
        if r.first_token_s is None:
            unstarted[r.tenant] += 1
        first = r.first_token_s if r.first_token_s is not None else duration_s
        ttft[r.tenant].append(first - r.arrival_s)
        e2e[r.tenant].append(_e2e_or_censored(r, duration_s))
    return ttft, e2e, unstarted


def _e2e_or_censored(r: RequestRecord, duration_s: float) -> float:
    return (r.finish_s if r.finish_s is not None else max(duration_s, r.arrival_s)) - r.arrival_s


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None
