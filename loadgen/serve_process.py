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
from collections.abc import Iterator, Mapping
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
    completion with ``key`` came back; yields (base URL, the key, its process id). ``environment``:
    more of its process's environment (secrets)."""
    with tempfile.TemporaryDirectory(prefix="fg-bench-") as tmp:
        path = Path(tmp) / "gateway.yaml"
        path.write_text(yaml.safe_dump(gateway))
        env = {k: v for k, v in LAUNCH_ENVIRONMENT.items() if not k.startswith(CLUSTER_ENV_PREFIXES)}
        env[FRONT_DOOR_ENV] = front_door
        env.update(environment or {})
        command = [sys.executable, "-m", "fairgate", "serve", "--config", str(path), "--port", str(port)]
        out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, process_group=0)
        try:
            base = f"http://127.0.0.1:{port}/v1"
            wait_for_completion(base, gateway.get("model") or "fairgate-sim", key, proc)
            yield base, key, proc.pid
        finally:
            proc.send_signal(signal.SIGTERM)  # it stops its cluster and its HAProxy itself
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(120)
            with contextlib.suppress(ProcessLookupError):  # whatever of its process group is left
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            if log is not None:
                out.close()  # type: ignore[union-attr]


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
