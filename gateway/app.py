"""Assemble the whole application (dispatcher, workers, ingress) from a gateway configuration into one
Ray Serve application, and start it on a local Ray cluster kept on loopback."""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import Any

import httpx
import ray
from ray import serve

from fairgate.common.config import GatewayConfig, WorkerSettings
from fairgate.common.frame_guard import frame_limit
from fairgate.common.loopback import front_door, pool_port, ray_environment
from fairgate.common.sections import checked_cluster_secret
from fairgate.gateway.config import deployable
from fairgate.ingress.deployment import INGRESS_ACTOR_OPTIONS, Ingress
from fairgate.workers.autoscaling import POLICY_PATH
from fairgate.workers.deployment import WorkerReplica, WorkerStart
from fairgate.workers.engines import engine_for


def build_app(app_name: str, config: GatewayConfig, secret: str, listen: str | None = None) -> serve.Application:
    """``listen``: host:port for the direct front door (each ingress replica's own HTTP server there);
    None: Serve's front door brings the requests."""
    checked_cluster_secret(secret)
    config = deployable(config, secret)
    frames = frame_limit(config.ingress.max_body_bytes)
    pools = []
    for i, m in enumerate(config.models):
        options = worker_options(app_name, m.workers, m.name, config.shards.count)
        options["name"] = worker_deployment_name(i, m.name)
        port = pool_port(config.network.worker_port, i)
        if port:  # a fixed port: one replica of the pool per node
            options["max_replicas_per_node"] = 1
        start = WorkerStart(m.workers.engine, m.workers.settings, config.telemetry, port, frames, config.shards.count)
        pools.append(WorkerReplica.options(**options).bind(app_name, start, secret, m.name))
    ingress = Ingress.options(num_replicas=config.ingress.replicas, **ingress_placement())
    return ingress.bind(app_name, ingress_view(config), secret, pools, listen)


# A Ray custom resource only the nodes meant for the ingress have (where the front door is, and the
# dispatcher, which the ingress creates); unset: any node.
INGRESS_RESOURCE_ENV = "FAIRGATE_INGRESS_RESOURCE"


def ingress_placement() -> dict[str, Any]:
    resource = os.environ.get(INGRESS_RESOURCE_ENV)
    if not resource:
        return {}
    return {"ray_actor_options": {**INGRESS_ACTOR_OPTIONS, "resources": {resource: 0.001}}}


# How each pool's replicas are run: none of the ingress's business. Left out of what the ingress is built
# from, so that a change of them (a worker count) redeploys the workers without replacing the ingress
# replicas, and their clients' connections.
REPLICA_FIELDS = ("count", "num_gpus", "num_cpus", "autoscaling", "graceful_shutdown_s")


def ingress_view(config: GatewayConfig) -> GatewayConfig:
    """``config`` with each pool's replica fields at their defaults (the ingress reads its engine only)."""
    defaults = WorkerSettings()

    def engine_only(workers: WorkerSettings) -> WorkerSettings:
        return workers.model_copy(update={name: getattr(defaults, name) for name in REPLICA_FIELDS})

    models = [m.model_copy(update={"workers": engine_only(m.workers)}) for m in config.models]
    return config.with_models(models)


def worker_deployment_name(index: int, model: str) -> str:
    """The first model's workers keep the one-model name; each other pool's is named after its model."""
    return "WorkerReplica" if index == 0 else "WorkerReplica-" + re.sub(r"[^A-Za-z0-9_-]", "-", model)


def worker_options(app_name: str, w: WorkerSettings, model: str | None = None, shards: int = 1) -> dict[str, Any]:
    """Replicas of a pool's worker deployment: a fixed count, or autoscaled on the demand of its pool in
    the dispatcher. A replica scaled down drains: it takes no new work and finishes what runs
    (``graceful_shutdown_s``)."""
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": w.num_cpus, "num_gpus": w.num_gpus},
        "graceful_shutdown_timeout_s": w.graceful_shutdown_s,
    }
    a = w.autoscaling
    if a is None:
        return options | {"num_replicas": w.count}
    kv_tokens, max_running = engine_for(w.engine).capacity(w.settings)
    policy = {
        "policy_function": POLICY_PATH,
        "policy_kwargs": {
            "app": app_name,
            "model": model,
            "kv_tokens_per_replica": kv_tokens,
            "max_running_per_replica": max_running,
            "target_utilization": a.target_utilization,
            "shards": shards,
        },
    }
    return options | {
        "autoscaling_config": {
            "min_replicas": a.min_replicas,
            "max_replicas": a.max_replicas,
            "initial_replicas": max(a.min_replicas, min(a.max_replicas, w.count)),
            "upscale_delay_s": a.upscale_delay_s,
            "downscale_delay_s": a.downscale_delay_s,
            "metrics_interval_s": 1.0,
            "policy": policy,
        }
    }


def start_local_ray(num_cpus: int | None = None) -> None:
    """Ray on this machine only: every listener on 127.0.0.1, no usage reporting."""
    ray_environment()
    if ray.is_initialized():
        return
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        namespace="fairgate",
        _node_ip_address="127.0.0.1",
        runtime_env={"worker_process_setup_hook": "fairgate.common.loopback.bind_serve_to_loopback"},
        logging_level="WARNING",
    )


def run_app(app_name: str, config: GatewayConfig, secret: str, port: int, route_prefix: str = "/") -> str:
    """Deploy the application behind the front door (``FAIRGATE_FRONT_DOOR``) on 127.0.0.1:``port``:
    the ingress replicas' own server (direct, no route prefix), or Serve's, started if it is not yet;
    returns the gateway's URL once requests reach it."""
    if front_door() == "direct":
        serve.start(proxy_location="Disabled")
        listen = f"127.0.0.1:{port}"
        serve.run(build_app(app_name, config, secret, listen), name=app_name, route_prefix=None)
        url = f"http://{listen}"
    else:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(app_name, config, secret), name=app_name, route_prefix=route_prefix)
        url = f"http://127.0.0.1:{port}{route_prefix.rstrip('/')}"
    wait_until_routed(url)
    return url


def wait_until_routed(url: str, timeout_s: float = 60.0) -> None:
    """Until the gateway's own health answer comes through the front door at ``url``: an application
    Serve reports running may not be in HAProxy's routes yet (it answers 404 for a while)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = httpx.get(f"{url}/healthz", timeout=2)
            if r.status_code == 200 and r.json() == {"status": "ok"}:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway at {url} is not reachable after {timeout_s:.0f} s")
        time.sleep(0.2)
