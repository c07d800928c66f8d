"""``fairgate serve`` as users start it, in a process (and Ray cluster) of its own, for benchmarks that
drive a whole gateway from outside: started from a configuration, waited for until it answers, and
stopped with its whole process group."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from fairgate.common.loopback import FRONT_DOOR_ENV

# The environment this process started with: importing an engine's library changes the importer's (vLLM
# sets LD_PRELOAD, thread and compiler settings), and each gateway starts as from a user's shell.
LAUNCH_ENVIRONMENT = dict(os.environ)
# Settings of a cluster's HAProxy that a gateway's process must not inherit: it starts a cluster of its own.
CLUSTER_ENV_PREFIXES = ("RAY_SERVE_HAPROXY", "RAY_SERVE_ENABLE_HA_PROXY", "FAIRGATE_HAPROXY")


@dataclass(frozen=True)
class GatewayLaunch:
    """One gateway to start: its configuration, port and a key it serves; where its output goes
    (``log``), the front door it runs behind and more of its process's environment (secrets)."""

    gateway: dict[str, Any]
    port: int
    key: str
    front_door: str = "direct"
    log: Path | None = None
    environment: Mapping[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def served_gateway(
    gateway: dict[str, Any],
    port: int,
    key: str,
    front_door: str = "direct",
    log: Path | None = None,
    environment: Mapping[str, str] | None = None,
) -> Iterator[tuple[str, str, int]]:
    """The gateway of configuration ``gateway`` on 127.0.0.1:``port`` until the block ends, once a
    completion with ``key`` came back; yields (base URL, the key, its process id)."""
    launch = GatewayLaunch(gateway, port, key, front_door, log, environment or {})
    with served_gateways([launch]) as (served,):
        yield served


@contextlib.contextmanager
def served_gateways(launches: Sequence[GatewayLaunch]) -> Iterator[list[tuple[str, str, int]]]:
    """Every gateway of ``launches`` until the block ends, each as ``served_gateway`` yields it. They
    start together and stop together: each starts a Ray cluster of its own, mostly waiting."""
    with tempfile.TemporaryDirectory(prefix="fg-bench-") as tmp, contextlib.ExitStack() as logs:
        procs: list[subprocess.Popen[bytes]] = []
        # each one's output, kept in the scratch folder when no log was asked for (a failed start shows it)
        outputs = [launch.log or Path(tmp) / f"gateway-{i}.log" for i, launch in enumerate(launches)]
        try:
            for i, launch in enumerate(launches):
                path = Path(tmp) / f"gateway-{i}.yaml"
                path.write_text(yaml.safe_dump(launch.gateway))
                env = {k: v for k, v in LAUNCH_ENVIRONMENT.items() if not k.startswith(CLUSTER_ENV_PREFIXES)}
                env[FRONT_DOOR_ENV] = launch.front_door
                env.update(launch.environment)
                command = [sys.executable, "-m", "fairgate", "serve", "--config", str(path), "--port", str(launch.port)]
                out = logs.enter_context(open(outputs[i], "wb"))
                procs.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, process_group=0))
            served = []
            for launch, proc, output in zip(launches, procs, outputs, strict=True):
                base = f"http://127.0.0.1:{launch.port}/v1"
                try:
                    wait_for_completion(base, launch.gateway.get("model") or "fairgate-sim", launch.key, proc)
                except RuntimeError as exc:
                    raise RuntimeError(f"{exc}; the end of its output:\n{_tail(output)}") from None
                served.append((base, launch.key, proc.pid))
            yield served
        finally:
            _stop_all(procs)


def _tail(log: Path, chars: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace")[-chars:]
    return "(no output)"


def _stop_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Each stops its cluster and its HAProxy itself on SIGTERM; whatever of a process group is left
    after two minutes is killed."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 120
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def wait_for_completion(base: str, model: str, key: str, proc: subprocess.Popen, timeout_s: float = 600.0) -> None:
    """Until one completion comes back (the routes, the workers and the engine come late)."""
    deadline = time.monotonic() + timeout_s
    body = {"model": model, "prompt": "hello", "max_tokens": 1}
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"fairgate serve exited with {proc.returncode} before it served")
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.post(base + "/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
            if r.status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway at {base} did not answer within {timeout_s:.0f} s")
        time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
