"""Keep every listener of a one-machine Ray cluster on loopback.

Ray 2.60's Serve replicas bind their inter-deployment gRPC server to ``[::]:0`` with no setting to
change it; on one machine that server only ever needs loopback. ``bind_serve_to_loopback`` is installed
as Ray's ``worker_process_setup_hook``, so it runs in every Ray worker process before any replica
starts (``deploy/serve.yaml`` names it too; it does nothing where ``FAIRGATE_BIND_HOST`` is a pod's
address). ``ray_environment`` is what ``fairgate serve`` and the tests set before Ray starts (it also
keeps Ray's worker processes at normal priority).
"""

from __future__ import annotations

import os

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


def ray_environment() -> None:
    for key, value in LOOPBACK_ENV.items():
        os.environ.setdefault(key, value)


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
