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
from workers.autoscaling import POLICY_PATH
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
        "telemetry": dataclasses.asdict(config.telemetry),
    }


def build_app(app_name: str, config: GatewayConfig, secret: str) -> serve.Application:
    g = gateway_dict(config)
    workers = WorkerReplica.options(**worker_options(app_name, config)).bind(
        app_name, dispatcher_settings(g), {**g["workers"], "telemetry": g["telemetry"]}, secret
    )
    return Ingress.options(num_replicas=config.ingress.replicas).bind(app_name, g, secret, workers)


def worker_options(app_name: str, config: GatewayConfig) -> dict[str, Any]:
    """Replicas of the worker deployment: a fixed count, or autoscaled on the dispatcher's demand.
    A replica scaled down drains: it takes no new work and finishes what runs (``graceful_shutdown_s``)."""
    w = config.workers
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": w.num_cpus, "num_gpus": w.num_gpus},
        "graceful_shutdown_timeout_s": w.graceful_shutdown_s,
    }
    a = w.autoscaling
    if a is None:
        return options | {"num_replicas": w.count}
    kv = w.vllm.get("kv_tokens") if w.engine == "vllm" else w.kv_tokens
    max_running = w.vllm.get("max_num_seqs") if w.engine == "vllm" else w.max_running
    policy = {
        "policy_function": POLICY_PATH,
        "policy_kwargs": {
            "app": app_name,
            "kv_tokens_per_replica": int(kv or w.kv_tokens),
            "max_running_per_replica": max_running,
            "target_utilization": a.target_utilization,
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
        runtime_env={"worker_process_setup_hook": "dispatcher.loopback.bind_serve_to_loopback"},
        logging_level="WARNING",
    )


def run_app(app_name: str, config: GatewayConfig, secret: str, port: int, route_prefix: str = "/") -> str:
    """Start Serve on 127.0.0.1:``port`` (if not yet started) and deploy the application."""
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(app_name, config, secret), name=app_name, route_prefix=route_prefix)
    return f"http://127.0.0.1:{port}{route_prefix.rstrip('/')}"
