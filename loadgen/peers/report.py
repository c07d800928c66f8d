"""The tables and plots of ``fairgate bench peers``: one per workload, every arm a row (a bar)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from fairgate.loadgen.peers.bench import FAIRGATE

TENANT_COLUMNS = 4  # tenants shown one by one; beyond, the one with the slowest median first token


def format_peers(out: dict[str, Any]) -> str:
    c = out["config"]
    lines = [
        f"{c['engines']} {c['engine']} engine(s) ({c['settings']}), {c['seconds']:.0f} s per pass, medians of "
        f"{c['rounds']} rounds, every arm measured with the others paused",
    ]
    for name, w in out["workloads"].items():
        lines += ["", *workload_table(name, w)]
    return "\n".join(lines)


def workload_table(name: str, w: dict[str, Any]) -> list[str]:
    arms = w["arms"]
    tenants = list(next(iter(arms.values()))["tenants"])
    shown = tenants if len(tenants) <= TENANT_COLUMNS else ["slowest"]
    head = "| arm | tokens/s | output tokens/s | prefix hits | gap / bound | Jain | "
    head += " | ".join(f"{t} TTFT p50/p99 s" for t in shown)
    lines = [
        f"**{name}** ({w['requests']} requests in {w['seconds']:.0f} s; bound {w['bound']:,.0f}; one stream to "
        f"an engine alone: first token {_num(w['alone_light_ttft_ms'], '.1f')} ms)",
        "",
        head + " | light load +ms | errors |",
        "|---" * (8 + len(shown)) + "|",
    ]
    for arm, a in arms.items():
        cells = [_ttft(a["tenants"][t]) for t in tenants] if len(tenants) <= TENANT_COLUMNS else [_slowest(a)]
        lines.append(
            f"| {arm} | {a['throughput_tokens_per_s']:,.0f} | {a['output_tokens_per_s']:,.0f} | "
            f"{_num(a['prefix_hit_rate'], '.0%')} | "
            f"{a['gap']:,.0f} ({a['gap_vs_bound']:.3f}) | "
            f"{_num(a['jain'], '.3f')} | " + " | ".join(cells) + f" | {_num(a['light_ttft_added_ms'], '+.1f')} | "
            f"{a['errors']} |"
        )
    v = w["verdict"]
    lines += [
        "",
        f"fairgate inside its bound every round: {v['inside_bound']}; throughput vs the best peer "
        f"{_num(v['throughput_vs_best_peer'], '.3f')}x (output tokens "
        f"{_num(v['output_vs_best_peer'], '.3f')}x); light-load first token vs the fastest peer "
        f"{_num(v['light_ttft_added_vs_fastest_peer_ms'], '+.1f')} ms; peers with a smaller gap: "
        f"{', '.join(v['fairer_peers']) or 'none'}; with more throughput: {', '.join(v['faster_peers']) or 'none'}",
    ]
    return lines


def _ttft(t: dict[str, Any]) -> str:
    return f"{_num(t['p50_ttft_s'], '.2f')} / {_num(t['p99_ttft_s'], '.2f')}"


def _slowest(a: dict[str, Any]) -> str:
    name, t = max(a["tenants"].items(), key=lambda kv: kv[1]["p50_ttft_s"] or 0.0)
    return f"{name}: {_ttft(t)}"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def plot_peers(path: Path, name: str, w: dict[str, Any]) -> Path:
    """Four panels, one bar per arm: gap over the bound, Jain's index, tokens/s, and each tenant's p99
    first-token time (the slowest tenants' when there are many)."""
    arms = list(w["arms"])
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    panels = [
        ("largest gap / fairgate's bound", [w["arms"][a]["gap_vs_bound"] for a in arms]),
        ("Jain's index (demand-aware)", [w["arms"][a]["jain"] or 0.0 for a in arms]),
        ("tokens/s", [w["arms"][a]["throughput_tokens_per_s"] for a in arms]),
    ]
    for ax, (title, values) in zip(axes, panels, strict=False):
        ax.bar(arms, values, color=["tab:green" if a.startswith(FAIRGATE) else "tab:gray" for a in arms])
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    axes[0].axhline(1.0, color="black", linestyle="--", linewidth=1.0)
    tenants = sorted(
        w["arms"][arms[0]]["tenants"], key=lambda t: -(w["arms"][arms[0]]["tenants"][t]["p99_ttft_s"] or 0.0)
    )[:TENANT_COLUMNS]
    width = 0.8 / max(1, len(tenants))
    for i, t in enumerate(tenants):
        xs = [j + i * width for j in range(len(arms))]
        axes[3].bar(xs, [w["arms"][a]["tenants"][t]["p99_ttft_s"] or 0.0 for a in arms], width, label=t)
    axes[3].set_xticks([j + 0.4 - width / 2 for j in range(len(arms))], arms, rotation=30, fontsize=8)
    axes[3].set_title("p99 first token (s), by tenant", fontsize=9)
    axes[3].legend(fontsize=7)
    fig.suptitle(f"{name}: {w['requests']} requests in {w['seconds']:.0f} s")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
