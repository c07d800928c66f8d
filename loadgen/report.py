"""The comparison table and ``report.json`` for a set of runs (simulated or measured)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The table's columns: the report's field | its title | how its value is written.
_COLUMN_TABLE = """
workload                  | workload     | {}
policy                    | policy       | {}
replicas                  | rep          | {}
throughput_tokens_per_s   | tok/s        | {:.0f}
work_per_s                | work/s       | {:.0f}
max_abs_service_diff      | max diff     | {:.0f}
bound_2u                  | 2U           | {:.0f}
bound_held                | held         | {}
avg_windowed_service_diff | avg win diff | {:.0f}
jain_index                | Jain         | {:.3f}
under_share_mean_ttft_s   | light TTFT s | {:.2f}
prefix_hit_rate           | cache hits   | {:.1%}
rejected                  | rejected     | {}
"""
COLUMNS = tuple(tuple(cell.strip() for cell in row.split("|")) for row in _COLUMN_TABLE.strip().splitlines())


def comparison_table(runs: Sequence[dict[str, Any]]) -> str:
    """A fixed-width table, one row per run (also used for the README's results section)."""
    header = [title for _, title, _ in COLUMNS]
    rows = [[_cell(run.get(key), fmt) for key, _, fmt in COLUMNS] for run in runs]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    return fmt.format(value)


def write_report(out_dir: Path, runs: Sequence[dict[str, Any]], meta: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    path.write_text(json.dumps({"meta": meta, "runs": list(runs)}, indent=1))
    return path


def main(argv: Sequence[str]) -> int:
    """``python -m fairgate.loadgen.report REPORT.json ...``: one table over the runs of several reports."""
    runs = [run for path in argv for run in json.loads(Path(path).read_text())["runs"]]
    print(comparison_table(runs))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
