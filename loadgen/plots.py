"""PNG plots of a workload's runs, policies side by side: service rate per tenant, the accumulated
service difference against 2U, and each request's response time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

MAX_LEGEND = 8


def plot_workload(path: Path, runs: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> Path:
    """``runs``: (report entry, series) pairs of one workload, one column per run."""
    cols = len(runs)
    fig, axes = plt.subplots(3, cols, figsize=(4.2 * cols, 9.0), squeeze=False, sharex="col")
    for col, (report, series) in enumerate(runs):
        title = f"{report['policy']} (×{report['replicas']})" if report["replicas"] > 1 else report["policy"]
        ax_rate, ax_gap, ax_lat = axes[0][col], axes[1][col], axes[2][col]
        ax_rate.set_title(title)
        for name, rates in zip(series["tenants"], series["rates"], strict=True):
            ax_rate.plot(series["rate_times"], rates, label=name, linewidth=1.2)
        ax_rate.set_ylim(bottom=0)
        ax_gap.plot(series["gap_times"], series["gap"], color="tab:red", linewidth=1.0)
        ax_gap.axhline(report["bound_2u"], color="black", linestyle="--", linewidth=1.0, label="2U")
        for name, arrivals, latency in zip(series["tenants"], series["arrivals"], series["latency"], strict=True):
            ax_lat.scatter(arrivals, latency, s=2, label=name)
        ax_lat.set_xlabel("time (s)")
        if col == 0:
            ax_rate.set_ylabel("service rate (cost/s, 60 s window)")
            ax_gap.set_ylabel("service difference, backlogged pair")
            ax_lat.set_ylabel("response time of finished requests (s)")
            if len(series["tenants"]) <= MAX_LEGEND:
                ax_rate.legend(fontsize=7, loc="upper left")
            ax_gap.legend(fontsize=7, loc="upper left")
    fig.suptitle(runs[0][0]["workload"])
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_scale(path: Path, rows: Sequence[dict[str, Any]], reference_rate: float) -> Path:
    """``fairgate bench scale``'s figures per fleet size: the dispatcher's CPU per request (and per
    worker message) at the reference rate, and the rate sustained at the p99 admission target."""
    workers = [r["workers"] for r in rows]
    fig, (ax_cpu, ax_rate) = plt.subplots(1, 2, figsize=(9.0, 3.6))
    ax_cpu.plot(workers, [r["dispatcher_cpu_ms_per_request"] for r in rows], marker="o", label="per request")
    ax_cpu.plot(workers, [r["dispatcher_cpu_ms_per_message"] for r in rows], marker="s", label="per worker message")
    ax_cpu.set_ylabel(f"dispatcher CPU, ms (at {reference_rate:,.0f} requests/s)")
    ax_cpu.set_ylim(bottom=0)
    ax_cpu.legend(fontsize=8)
    ax_rate.plot(workers, [r["sustained_requests_per_s"] for r in rows], marker="o", color="tab:green")
    ax_rate.set_ylabel("requests/s sustained at the p99 target")
    ax_rate.set_ylim(0, 1.15 * max([r["sustained_requests_per_s"] for r in rows] + [1.0]))
    for ax in (ax_cpu, ax_rate):
        ax.set_xscale("log", base=2)
        ax.set_xticks(workers, [f"{w:,}" for w in workers])
        ax.set_xlabel("workers")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
