"""``fairgate bench scale``'s short variant, as users run it: the dispatcher actor as a gateway creates it,
64 workers of the real worker code (simulated engines of the H200 preset, two fleet host processes),
the real admission frames, report streams and data plane, two short rate steps. It keeps the bench
working: every request placed without an error, the figures the issue names, and no fleet host left."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.test_cli import fairgate

pytestmark = pytest.mark.slow


def test_bench_scale_measures_the_dispatcher_against_a_fleet_of_64_workers(tmp_path):
    out, plot = tmp_path / "scale.json", tmp_path / "scale.png"
    proc = fairgate(
        "bench", "scale", "--workers", "64", "--seconds", "2", "--start-rate", "100", "--ramp", "2",
        "--max-rate", "200", "--json", str(out), "--plot", str(plot), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    (row,) = figures["rows"]
    assert row["workers"] == 64
    assert figures["cpu_per_request_ratio"] == 1.0  # one fleet size: it is its own reference
    first = row["steps"][0]
    assert first["errors"] == 0 and first["placed_requests_per_s"] > 0
    # how fast is the bench's finding, not this test's (beside the other test worker, a step may not hold)
    assert row["sustained_requests_per_s"] >= 0 and row["p99_admission_ms"] > 0
    assert row["dispatcher_cpu_ms_per_request"] > 0 and row["report_messages_per_s"] > 0
    assert row["snapshot_bytes"] > 0
    assert "| 64 |" in proc.stdout
    assert plot.read_bytes().startswith(b"\x89PNG")
    hosts = subprocess.run(["pgrep", "-f", "fairgate.loadgen.fleet_host"], capture_output=True, text=True).stdout
    assert not hosts.split(), "a fleet host outlived the bench"
