"""``fairgate serve`` and ``fairgate loadgen`` as users run them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import yaml

from tests.conftest import free_port
from tests.integration.test_cli import fairgate

from .gateway_helpers import deploy


@pytest.mark.slow
def test_serve_starts_prints_keys_serves_and_stops_on_sigterm(tmp_path):
    """The embedded default as the README starts it, here with two dispatcher shards (``--dispatchers``:
    one dispatcher is every other end-to-end test's; the flags that switch it to vLLM are
    test_local_models'; a gateway on vLLM workers, test_vllm's)."""
    port = free_port()
    exe = Path(sys.executable).parent / "fairgate"
    log = open(tmp_path / "serve.log", "w+")  # noqa: SIM115 - read back below
    proc = subprocess.Popen(
        [str(exe), "serve", "--port", str(port), "--workers", "2", "--policy", "vtc", "--dispatchers", "2"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        keys: dict[str, str] = {}
        deadline = time.monotonic() + 300  # a Ray cluster, beside the other test worker
        while time.monotonic() < deadline and len(keys) < 2:
            time.sleep(1)
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            keys = dict(re.findall(r"tenant (\w+): api key (\S+)", (tmp_path / "serve.log").read_text()))
        assert set(keys) == {"alice", "bob"}
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=keys["alice"], max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="fairgate-sim", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        r = raw.parse()
        assert r.usage.completion_tokens <= 4 and r.choices[0].message.content
        assert raw.headers["x-fairgate-shard"] in ("0", "1")  # two dispatcher shards serve it
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=90)
    assert code == 0
    assert "stopping fairgate" in (tmp_path / "serve.log").read_text()


def test_serve_rejects_bad_flags_in_one_line(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("tenants: []\n")
    for args, needle in (
        (["serve", "--policy", "nope"], "unknown policy"),
        (["serve", "--config", str(bad)], "at least one tenant"),
        (["serve", "--port", "0"], "--port"),
        (["serve", "--dispatchers", "0"], "--dispatchers must be between 1 and 64"),
        (["serve", "--engine", "vllm", "--kv-tokens", "0"], "--kv-tokens"),
        (["serve", "--workers", "0"], "--workers"),
    ):
        proc = fairgate(*args)
        assert proc.returncode == 2 and needle in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.slow
def test_loadgen_replays_a_workload_against_the_gateway(serve_port, tmp_path):
    gw = deploy("lg", serve_port, workers=1, kv_tokens=2000, step_s=0.005, tenants=("alice", "bob"))
    try:
        spec = tmp_path / "w.yaml"
        spec.write_text(
            "duration_s: 8\ntenants:\n"
            "  - {name: A, rate: 2, prompt_len: 20, output_len: 10}\n"
            "  - {name: B, rate: 4, prompt_len: 20, output_len: 10}\n"
        )
        keys = tmp_path / "keys.yaml"
        keys.write_text(yaml.safe_dump({"A": gw.keys["alice"], "B": gw.keys["bob"]}))
        out = tmp_path / "out"
        proc = fairgate(
            "loadgen", "--workload", str(spec), "--url", gw.base_url, "--keys", str(keys), "--out", str(out),
            "--label", "vtc", "--pool-tokens", "2000", "--no-progress",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        run = json.loads((out / "report.json").read_text())["runs"][0]
        assert run["policy"] == "vtc" and set(run["tenants"]) == {"A", "B"}
        assert run["errors"] == {"A": 0, "B": 0}
        assert run["prefix_hit_rate"] > 0  # every prompt is the same: the engine's final usage reports the hits
        assert run["tenants"]["B"]["requests"] == 2 * run["tenants"]["A"]["requests"]
        # the light load is served in full: service = (20 + 2 × 10) per request
        finished = sum(run["tenants"][t]["service"] for t in "AB") / 40
        assert finished >= 0.8 * (run["tenants"]["A"]["requests"] + run["tenants"]["B"]["requests"])
        assert (out / "w.png").is_file()
        stats = gw.stats()
        assert stats["tenants"]["alice"]["finished"] > 0 and stats["tenants"]["bob"]["finished"] > 0
    finally:
        gw.delete()


def test_loadgen_needs_a_key_for_every_tenant(tmp_path):
    proc = fairgate("loadgen", "--workload", "overload", "--url", "http://127.0.0.1:9/v1", "--duration", "1")
    assert proc.returncode == 2 and "no API key for tenant(s) A, B" in proc.stderr


@pytest.mark.slow
def test_bench_openai_measures_the_engine_alone_and_the_gateway_behind_a_front_door(tmp_path):
    """``fairgate bench openai`` as users run it, small: the engine served alone and ``fairgate serve``
    behind Serve's HAProxy ingress (the direct front door is the serve test's above); every arm
    serves without an error, and no haproxy process outlives the run."""
    out = tmp_path / "bench.json"
    proc = fairgate(
        "bench", "openai", "--engine", "simulated", "--rounds", "1", "--requests", "24", "--concurrency", "4",
        "--max-tokens", "16", "--short-requests", "100", "--front-doors", "haproxy", "--json", str(out), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert set(figures["arms"]) == {"alone", "haproxy"}
    for arm in figures["arms"].values():
        assert arm["errors"] == 0 and arm["error_kinds"] == {}
        assert arm["output_tokens_per_s"] > 0 and arm["short_requests_per_s"] > 0
    assert "fairgate (haproxy) / alone" in proc.stdout
    assert not _orphaned_haproxies(), "a haproxy process outlived the bench"


def _orphaned_haproxies() -> list[str]:
    """HAProxy processes of fairgate runs whose Ray cluster is gone: their parent, Serve's proxy actor,
    went with it (another test worker's run, alive, keeps its own)."""
    found = subprocess.run(["pgrep", "-f", "haproxy.cfg"], capture_output=True, text=True).stdout.split()
    orphans = []
    for pid in found:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            parent = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if "/fgh-" in cmdline and parent == 1:
            orphans.append(pid)
    return orphans
