"""Real traces: read a CSV (req_id, client, prompt_len, output_len, req_time_s), or synthesise one
with the statistics of the paper's arena trace for users who have no trace file."""

from __future__ import annotations

import csv
import json
from importlib import resources
from pathlib import Path

import numpy as np

TRACE_COLUMNS = ("req_id", "client", "prompt_len", "output_len", "req_time_s")
Row = tuple[str, float, int, int]  # tenant, arrival_s, prompt_tokens, output_tokens


def load_trace_csv(path: str | Path) -> tuple[list[Row], float]:
    """Rows sorted by arrival and the trace's duration (its last arrival, at least 1 s)."""
    rows: list[Row] = []
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise ValueError(f"trace {path}: missing column(s) {', '.join(missing)}")
            for line, rec in enumerate(reader, start=2):
                try:
                    row = (
                        rec["client"],
                        float(rec["req_time_s"]),
                        int(rec["prompt_len"]),
                        int(rec["output_len"]),
                    )
                except (TypeError, ValueError):
                    raise ValueError(f"trace {path}: line {line}: bad number in {dict(rec)}") from None
                if row[1] < 0 or row[2] < 0 or row[3] < 1:
                    raise ValueError(f"trace {path}: line {line}: negative time or length, or output < 1")
                rows.append(row)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"trace {path}: cannot read: {exc}") from None
    if not rows:
        raise ValueError(f"trace {path}: no requests")
    rows.sort(key=lambda r: (r[1], r[0]))
    return rows, max(1.0, rows[-1][1])


def synthesize_arena_trace(seed: int) -> tuple[list[Row], float]:
    """A trace with the arena trace's per-client counts, active windows and log-normal length fits;
    Poisson arrivals within each client's window."""
    stats = json.loads(resources.files("fairgate.loadgen").joinpath("data/arena_trace_stats.json").read_text())
    rng = np.random.default_rng(seed)
    max_p, max_o = stats["max_prompt_tokens"], stats["max_output_tokens"]
    rows: list[Row] = []
    for c in stats["clients"]:
        n = c["requests"]
        start, end = c["first_s"], max(c["last_s"], c["first_s"] + 1.0)
        times = np.sort(rng.uniform(start, end, n))  # n Poisson arrivals conditioned on the window
        prompts = np.clip(np.rint(rng.lognormal(c["prompt_log_mean"], c["prompt_log_std"], n)), 1, max_p)
        outputs = np.clip(np.rint(rng.lognormal(c["output_log_mean"], c["output_log_std"], n)), 1, max_o)
        rows.extend((c["client"], float(t), int(p), int(o)) for t, p, o in zip(times, prompts, outputs, strict=True))
    rows.sort(key=lambda r: (r[1], r[0]))
    return rows, float(stats["duration_s"])
