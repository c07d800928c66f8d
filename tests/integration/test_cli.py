"""The ``fairgate`` command as users run it (a real subprocess)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REQUIRED_RUN_KEYS = {
    "workload",
    "policy",
    "replicas",
    "kv_tokens",
    "duration_s",
    "throughput_tokens_per_s",
    "max_abs_service_diff",
    "bound_2u",
    "bound_held",
    "jain_index",
    "tenants",
}
REQUIRED_TENANT_KEYS = {"service", "requests", "rejected", "mean_ttft_s", "p99_ttft_s"}


def fairgate(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("fairgate", path=str(Path(sys.executable).parent)) or "fairgate"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def small_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "two.yaml"
    spec.write_text(
        "duration_s: 60\ntenants:\n"
        "  - {name: light, rate: 0.5}\n"
        "  - {name: heavy, rate: 4, prompt_len: [100, 300], output_len: [50, 300]}\n"
    )
    return spec


def test_simulate_writes_report_and_plots(tmp_path):
    out = tmp_path / "out"
    proc = fairgate(
        "simulate", "--workload", str(small_spec(tmp_path)), "--policy", "vtc", "--policy", "fcfs",
        "--policy", "rpm:5", "--replicas", "2", "--kv-tokens", "4000", "--out", str(out), "--seed", "3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "vtc" in proc.stdout and "fcfs" in proc.stdout and "rpm:5" in proc.stdout
    data = json.loads((out / "report.json").read_text())
    assert [r["policy"] for r in data["runs"]] == ["vtc", "fcfs", "rpm:5"]
    for run in data["runs"]:
        assert set(run) >= REQUIRED_RUN_KEYS
        assert run["replicas"] == 2 and run["kv_tokens"] == 4000
        for row in run["tenants"].values():
            assert set(row) >= REQUIRED_TENANT_KEYS
    png = out / "two.png"
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"


def test_simulate_states_the_bound_for_merged_reports_with_revocation_on(tmp_path):
    """Reports merged for half a second: the bound the report states grows by what they carried."""
    bounds = []
    for interval in ("0", "0.5"):
        out = tmp_path / interval
        proc = fairgate(
            "simulate", "--workload", str(small_spec(tmp_path)), "--policy", "vtc", "--revoke",
            "--report-interval", interval, "--out", str(out), "--seed", "3", "--no-plots",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        (run,) = json.loads((out / "report.json").read_text())["runs"]
        bounds.append(run["bound_2u"])
        assert run["bound_held"]
    assert bounds[1] > bounds[0]


def test_simulate_is_deterministic_for_a_seed(tmp_path):
    spec = small_spec(tmp_path)
    reports = []
    for i in range(2):
        out = tmp_path / f"o{i}"
        assert fairgate("simulate", "--workload", str(spec), "--out", str(out), "--no-plots").returncode == 0
        reports.append(json.loads((out / "report.json").read_text())["runs"])
    assert reports[0] == reports[1]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["simulate", "--workload", "overload", "--policy", "round-robin"], "unknown policy 'round-robin'"),
        (["simulate", "--workload", "no_such_workload"], "unknown workload 'no_such_workload'"),
        (["simulate", "--workload", "overload", "--replicas", "0"], "--replicas"),
        (["simulate", "--workload", "overload", "--report-interval", "-1"], "--report-interval"),
        (["simulate", "--workload", "overload", "--replicas", "2", "--shards", "3"], "--shards"),
        (["simulate", "--workload", "overload", "--replicas", "2", "--shards", "2", "--pin", "A=2"], "--pin"),
        (["bench", "shards", "--engines", "4", "--shards", "1,8"], "--engines"),
        (["simulate", "--workload", "overload", "--threshold", "-5"], "--threshold"),
        (["simulate", "--workload", "overload", "--policy", "rpm:zero"], "rpm"),
        (["simulate"], "--workload"),
        (["bench", "core", "--tenants", "ten"], "--tenants"),
        (["simulate", "--workload", "overload", "--max-running", "0"], "--max-running"),
        (["profile", "--inputs", "8,x"], "--inputs"),
        (["profile", "--outputs", "0"], "--outputs"),
        (["bench", "vllm", "--policies", "vtc,nope"], "unknown policy 'nope'"),
        (["bench", "vllm", "--clients", "0"], "--clients"),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(args, needle):
    proc = fairgate(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("fairgate: error:")


def test_malformed_workload_file_is_named(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("duration_s: 10\ntenants: [{name: a, rate: -3}]\n")
    proc = fairgate("simulate", "--workload", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "rate must be positive" in proc.stderr


def test_bench_core_prints_decisions_per_second():
    proc = fairgate("bench", "core", "--tenants", "10,1000", "--decisions", "2000")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["10", "1000"]
    assert all(float(r[1].replace(",", "")) > 0 for r in rows)
