"""A whole node lost under load, on a real multi-node Ray cluster on this machine, as its own driver
(``python -m tests.e2e.node_loss``; ``tests/e2e/test_node_loss.py`` runs it and checks its figures).

A head (the dispatcher, the ingress and Serve's proxy: no CPU for replicas) and two worker nodes (one
CPU each: one worker replica each) are started with ``ray start``, every port on loopback and given.
Two tenants flood the gateway with streaming requests; one worker node is killed whole (its raylet
and every process under it, SIGKILL); later the node is started again, as Kubernetes would replace a
pod. Prints one JSON object: how each request ended (by reason), when the replica came back, the
tokens each tenant was charged against what its clients received, and the fair shares after recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from tests.conftest import free_port
from tests.e2e.stream_clients import Outcomes, streaming_client

STREAMS = 6  # closed-loop streams per tenant
STEP_S = 0.02
KV_TOKENS = 4000
ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "FAIRGATE_DISPATCHER_RESOURCE": "fg-head",
    "FAIRGATE_INGRESS_RESOURCE": "fg-head",
    # a dead node is declared dead within a few seconds (Ray's default waits about half a minute)
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    # Ray's token authentication on, as on Kubernetes: every node and the driver hold this run's token
    "RAY_AUTH_MODE": "token",
    "RAY_AUTH_TOKEN": secrets.token_hex(32),
}
RAY_START = [sys.executable, "-m", "tests.e2e.ray_start_loopback", "start"]  # every listener on 127.0.0.1


WORKER_PORTS = {"head": 20400, "node-a": 20600, "node-b": 20800}


NODE_PORTS = ["node-manager", "object-manager", "runtime-env-agent", "dashboard-agent-grpc"]
NODE_PORTS += ["dashboard-agent-listen", "metrics-export"]


@dataclass
class Node:
    """One node of the cluster; ``ports``: its ``ray start --<name>-port`` values, chosen at its first
    start and kept for the next (a node started again is the same node); ``gcs``: the head's GCS port."""

    name: str
    ports: dict[str, int] = field(default_factory=dict)
    gcs: int = 0

    def start(self, gcs: int | None, temp_dir: str, resources: dict[str, float], cpus: int) -> None:
        if not self.ports:
            base = WORKER_PORTS[self.name]  # a worker port range of its own, outside Ray's default
            self.ports = {n: free_port() for n in NODE_PORTS} | {"min-worker": base, "max-worker": base + 99}
        args = [*RAY_START, "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", "--num-gpus=0"]
        args += [f"--resources={json.dumps(resources)}", "--disable-usage-stats"]
        args += [f"--{n}-port={p}" for n, p in self.ports.items()]
        if gcs is None:
            self.gcs = free_port()
            args += ["--head", f"--port={self.gcs}", f"--temp-dir={temp_dir}", "--include-dashboard=false"]
            args += [f"--ray-client-server-port={free_port()}"]
        else:
            args += [f"--address=127.0.0.1:{gcs}"]
        done = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **ENV}, timeout=120)
        if done.returncode:
            raise RuntimeError(f"ray start ({self.name}) failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")

    def raylet(self) -> psutil.Process:
        port = f"--node_manager_port={self.ports['node-manager']}"
        for proc in psutil.process_iter(["cmdline"]):
            if port in (proc.info["cmdline"] or []):
                return proc
        raise RuntimeError(f"no raylet for {self.name}")

    def processes(self) -> set[psutil.Process]:
        """The node's raylet, every process under it and every worker process of it."""
        raylet = self.raylet()
        port = str(self.ports["node-manager"])
        found = {raylet, *raylet.children(recursive=True)}
        return found | {p for p in psutil.process_iter(["cmdline"]) if _names_port(p.info["cmdline"], "node", port)}

    def kill(self) -> int:
        """Every process of the node at once (SIGKILL): the node is gone."""
        return _kill(self.processes())


def _names_port(cmdline: list[str] | None, what: str, port: str) -> bool:
    return any(what in arg and arg.endswith("=" + port) for arg in cmdline or [])


def _kill(victims: set[psutil.Process]) -> int:
    for proc in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(list(victims), timeout=10)
    return len(victims)


def stop_cluster(nodes: list[Node]) -> None:
    """Every process of this cluster (and none of another Ray on this machine): each node's, and every
    process that names this cluster's GCS."""
    gcs = f"127.0.0.1:{nodes[0].gcs}"
    for node in nodes:
        with contextlib.suppress(RuntimeError):
            node.kill()
    port = str(nodes[0].gcs)
    rest = {
        p
        for p in psutil.process_iter(["cmdline"])
        if p.pid != os.getpid() and any(gcs in a or a.endswith("=" + port) for a in p.info["cmdline"] or [])
    }
    _kill(rest)


def main() -> dict[str, Any]:
    os.environ.update(ENV)  # before Ray is imported: it reads its authentication mode once
    import openai
    import ray
    import yaml
    from ray import serve
    from ray.serve import _private as _

    from fairgate.gateway.app import build_app
    from fairgate.gateway.config import parse_config

    temp_dir = tempfile.mkdtemp(prefix="fg-nodes-")
    head, node_a, node_b = Node("head"), Node("node-a"), Node("node-b")
    figures: dict[str, Any] = {}
    try:
        head.start(None, temp_dir, {"fg-head": 1}, cpus=0)
        gcs = head.gcs
        node_a.start(gcs, temp_dir, {"fg-worker": 1}, cpus=1)
        node_b.start(gcs, temp_dir, {"fg-worker": 1}, cpus=1)
        ray.init(address=f"127.0.0.1:{gcs}", logging_level="ERROR")
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port, "location": "HeadOnly"})
        keys = {t: "fg-test-" + secrets.token_hex(12) for t in ("alice", "bob")}
        with open("gateway/default_config.yaml") as f:
            raw = yaml.safe_load(f)
        raw["tenants"] = [{"name": t, "api_key": k} for t, k in keys.items()]
        raw["admin_api_key"] = "fg-admin-" + secrets.token_hex(12)
        raw["workers"] = {
            "count": 2,
            "num_cpus": 1,
            "graceful_shutdown_s": 10,
            "kv_tokens": KV_TOKENS,
            "block_size": 1,
            "max_running": 4,
            "step_model": {
                "step_overhead_s": STEP_S,
                "prefill_per_token_s": 0.0,
                "decode_per_seq_s": 0.0,
                "decode_per_ctx_token_s": 0.0,
            },
        }
        config, _ = parse_config(raw)
        serve.run(build_app("nodes", config, secrets.token_hex(16)), name="nodes", route_prefix="/", blocking=False)
        base = f"http://127.0.0.1:{port}/v1"
        actor = ray.get_actor("fairgate-dispatcher-nodes", namespace="fairgate")

        def stats() -> dict[str, Any]:
            return ray.get(actor.stats.remote(), timeout=30)

        deadline = time.monotonic() + 300
        while len(stats()["workers"]) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the worker replicas did not start")
            time.sleep(0.5)
        figures["driver_on_head"] = ray.get_runtime_context().get_node_id() == _head_node_id(ray)
        figures["workers_before"] = sorted(w["id"] for w in stats()["workers"])

        async def flood() -> None:
            out = Outcomes()
            stop = asyncio.Event()
            clients = {
                t: openai.AsyncOpenAI(base_url=base, api_key=k, max_retries=0, timeout=120) for t, k in keys.items()
            }
            streams = [(t, client) for t, client in clients.items() for _ in range(STREAMS)]
            loops = [asyncio.create_task(streaming_client(client, t, stop, out)) for t, client in streams]
            await asyncio.sleep(5.0)
            victims = node_a.processes()  # found first: the snapshot is taken just before they die
            before = await asyncio.to_thread(stats)
            killed_at = time.monotonic()
            figures["processes_killed"] = _kill(victims)
            seen = [before["workers"]]  # what the dispatcher held on each worker until it saw the node gone
            while len(left := (await asyncio.to_thread(stats))["workers"]) > 1:  # the dispatcher sees it gone
                seen.append(left)
                await asyncio.sleep(0.2)
            figures["worker_lost_after_s"] = time.monotonic() - killed_at
            victim_id = next(w["id"] for w in before["workers"] if w["id"] != left[0]["id"])
            figures["running_on_victim"] = max(  # requests may still reach it between the snapshot and the kill
                w["running"] + w.get("waiting", 0) for workers in seen for w in workers if w["id"] == victim_id
            )
            await asyncio.sleep(1.0)
            await asyncio.to_thread(node_a.start, gcs, temp_dir, {"fg-worker": 1}, 1)  # the node comes back
            while len((await asyncio.to_thread(stats))["workers"]) < 2:
                await asyncio.sleep(0.5)
            figures["replica_back_after_s"] = time.monotonic() - killed_at
            recovered = await asyncio.to_thread(stats)
            await asyncio.sleep(10.0)
            after = await asyncio.to_thread(stats)
            stop.set()
            await asyncio.gather(*loops)
            figures["shares_after_recovery"] = {
                t: after["tenants"][t]["service"] - recovered["tenants"][t]["service"] for t in keys
            }
            figures["gap_after_recovery"] = abs(
                after["tenants"]["alice"]["counter"] - after["tenants"]["bob"]["counter"]
            )
            figures["outcomes"] = {
                "completed": [{"tenant": t, "tokens": n} for t, _, n in out.completed],
                "failed": [{"tenant": t, "streamed": streamed, "reason": why} for t, _, streamed, why in out.failed],
            }

        asyncio.run(flood())
        deadline = time.monotonic() + 60
        while True:
            end = stats()
            if end["queue_depth"] + end["in_flight"] + end["pending_submits"] + end["orphans"] == 0:
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        figures["end"] = {
            "tenants": {
                t: {k: end["tenants"][t][k] for k in ("output_tokens", "service", "counter", "lifted")} for t in keys
            },
            "queue_depth": end["queue_depth"],
            "in_flight": end["in_flight"],
            "pending_submits": end["pending_submits"],
            "orphans": end["orphans"],
            "workers": len(end["workers"]),
        }
        figures["bound_2u"] = ray.get(actor.telemetry.remote(), timeout=30)["two_u"]
    finally:
        if head.gcs:
            stop_cluster([head, node_a, node_b])
    return figures


def _head_node_id(ray: Any) -> str:
    return next(n["NodeID"] for n in ray.nodes() if n["Resources"].get("fg-head"))


if __name__ == "__main__":
    print(json.dumps(main()))
