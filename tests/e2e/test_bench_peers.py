"""``fairgate bench peers``'s short variant, as users run it: fairgate and SGLang's router on the same two
simulated engines, the overload workload for a few seconds, one round. It keeps
the bench working: every arm up, every request served without an error, the figures, the table and the
plot written, and nothing left running on the shared engines."""

from __future__ import annotations

import json
import subprocess

from tests.integration.test_cli import fairgate


def test_bench_peers_runs_fairgate_against_a_peer_on_shared_engines(tmp_path):
    logs = tmp_path / "logs"
    proc = fairgate(
        "bench", "peers", "--workloads", "overload", "--peers", "sglang-router", "--seconds", "6", "--rounds", "1",
        "--out", str(tmp_path), "--log-dir", str(logs), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads((tmp_path / "peers.json").read_text())
    w = out["workloads"]["overload"]
    assert set(w["arms"]) == {"fairgate", "sglang-router"}
    for arm in w["arms"].values():
        assert arm["errors"] == 0
        assert arm["output_tokens_per_s"] > 0  # 6 s is less than one 256-token answer under overload
        assert arm["light_ttft_added_ms"] is not None
        assert set(arm["tenants"]) == {"A", "B"}
    assert w["arms"]["fairgate"]["gap"] <= w["bound"]
    assert w["verdict"]["inside_bound"]
    ours, peer = w["arms"]["fairgate"], w["arms"]["sglang-router"]
    assert w["verdict"]["throughput_vs_best_peer"] == ours["throughput_tokens_per_s"] / peer["throughput_tokens_per_s"]
    assert w["alone_light_ttft_ms"] > 0
    assert "| fairgate |" in proc.stdout and "| sglang-router |" in proc.stdout
    assert (tmp_path / "peers-overload.png").stat().st_size > 0
    routers = subprocess.run(["pgrep", "-f", "sglang_router.launch_router"], capture_output=True, text=True).stdout
    assert not routers.split(), "a router outlived the bench"
    assert (logs / "engine-0.log").exists() and (logs / "fairgate-overload.log").exists()
