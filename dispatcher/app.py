"""Assemble the whole application (dispatcher, workers, ingress) from a gateway configuration, and
start it on a local Ray cluster kept on loopback."""

from __future__ import annotations

import dataclasses
from typing import Any

import ray
from ray import serve

from dispatcher.actor import dispatcher_settings
from dispatcher.config import GatewayConfig
from dispatcher.ingress import Ingress
from dispatcher.loopback import ray_environment
from workers.deployment import WorkerReplica


def gateway_dict(config: GatewayConfig) -> dict[str, Any]:
    """The configuration as plain data (what travels to Serve replicas): key hashes, never keys."""
    return {
        "model": config.model,
        "scheduler": config.scheduler,
        "ingress": dataclasses.asdict(config.ingress),
        "workers": dataclasses.asdict(config.workers),
        "tenants": [dataclasses.asdict(t) for t in config.tenants],
        "admin_key_hash": config.admin_key_hash,
        "state": dataclasses.asdict(config.state),
    }


def build_app(app_name: str, config: GatewayConfig, secret: str) -> serve.Application:
    g = gateway_dict(config)
    dispatcher = dispatcher_settings(g)
    workers = WorkerReplica.options(
        num_replicas=config.workers.count,
        ray_actor_options={"num_cpus": 0, "num_gpus": config.workers.num_gpus},
    ).bind(app_name, dispatcher, g["workers"], secret)
    return Ingress.options(num_replicas=config.ingress.replicas).bind(app_name, g, secret, workers)


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
        runtime_env={"worker_process_setup_hook": "dispatcher.loopback.bind_serve_to_loopback"},
        logging_level="WARNING",
    )


def run_app(app_name: str, config: GatewayConfig, secret: str, port: int, route_prefix: str = "/") -> str:
    """Start Serve on 127.0.0.1:``port`` (if not yet started) and deploy the application."""
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(app_name, config, secret), name=app_name, route_prefix=route_prefix)
    return f"http://127.0.0.1:{port}{route_prefix.rstrip('/')}"
