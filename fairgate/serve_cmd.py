"""``fairgate serve``: the whole gateway on this machine, stopped cleanly by Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import signal
import threading
from typing import Any

from dispatcher.config import ConfigError, GatewayConfig, load_config
from dispatcher.core import parse_policy


def serve_main(config_path: str | None, workers: int | None, policy: str | None, port: int) -> int:
    config, generated_keys = load_config(config_path)
    config = _override(config, workers, policy)
    secret = os.environ.get("FAIRGATE_CLUSTER_SECRET") or secrets.token_hex(32)

    from ray import serve

    from dispatcher.actor import dispatcher_name
    from dispatcher.app import run_app, start_local_ray

    start_local_ray()
    url = run_app("fairgate", config, secret, port)
    print(
        f"fairgate is serving {config.model!r} at {url}/v1 ({config.workers.count} simulated workers, "
        f"policy {parse_policy(config.scheduler['policy']['name']).name})"
    )
    for name, key in generated_keys.items():
        print(f"  tenant {name}: api key {key}")
    if not generated_keys:
        print("  tenants and keys: as in the configuration file")
    print("Ctrl-C stops it.", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    print("stopping fairgate ...", flush=True)
    serve.shutdown()
    _kill_dispatcher(dispatcher_name("fairgate"))
    import ray

    ray.shutdown()
    return 0


def _override(config: GatewayConfig, workers: int | None, policy: str | None) -> GatewayConfig:
    changes: dict[str, Any] = {}
    if workers is not None:
        if workers < 1:
            raise ConfigError("--workers must be at least 1")
        changes["workers"] = dataclasses.replace(config.workers, count=workers)
    if policy is not None:
        try:
            parsed = parse_policy(policy)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        changes["scheduler"] = {**config.scheduler, "policy": dataclasses.asdict(parsed)}
    return dataclasses.replace(config, **changes)


def _kill_dispatcher(name: str) -> None:
    import ray

    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(name, namespace="fairgate"))
