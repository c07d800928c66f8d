"""``fairgate serve``: the whole gateway on this machine, stopped cleanly by Ctrl-C or SIGTERM."""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import signal
import threading
from typing import Any

from dispatcher.config import ADMIN, ConfigError, GatewayConfig, load_config, parse_workers, secret_from_env
from dispatcher.core import parse_policy


@dataclasses.dataclass(frozen=True)
class ServeOverrides:
    """Command-line flags that override the configuration file."""

    workers: int | None = None
    policy: str | None = None
    engine: str | None = None
    model: str | None = None
    kv_tokens: int | None = None


def serve_main(config_path: str | None, overrides: ServeOverrides, port: int) -> int:
    config, generated_keys = load_config(config_path)
    config = _override(config, overrides)
    secret = secret_from_env("FAIRGATE_CLUSTER_SECRET") or secrets.token_hex(32)  # else one per run

    from ray import serve

    from dispatcher.actor import dispatcher_name
    from dispatcher.app import run_app, start_local_ray

    start_local_ray()
    config = _place_on_gpus(config)
    url = run_app("fairgate", config, secret, port)
    print(
        f"fairgate is serving {config.model!r} at {url}/v1 ({config.workers.count} {config.workers.engine} workers, "
        f"policy {parse_policy(config.scheduler['policy']['name']).name})"
    )
    for name, key in generated_keys.items():
        print(f"  admin api key (for /admin) {key}" if name == ADMIN else f"  tenant {name}: api key {key}")
    if not [n for n in generated_keys if n != ADMIN]:
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


def _override(config: GatewayConfig, o: ServeOverrides) -> GatewayConfig:
    changes: dict[str, Any] = {}
    workers = config.workers
    if o.engine is not None or o.model is not None or o.kv_tokens is not None:
        engine = o.engine or ("vllm" if o.model is not None else workers.engine)
        raw_workers = dataclasses.asdict(workers) | {"engine": engine}
        if o.kv_tokens is not None:
            if o.kv_tokens < 1:
                raise ConfigError("--kv-tokens must be at least 1")
            raw_workers["kv_tokens"] = o.kv_tokens
        if engine == "vllm":
            vllm = dict(workers.vllm)
            if o.model is not None:
                vllm["model"] = o.model
            if o.kv_tokens is not None:
                vllm["kv_tokens"] = o.kv_tokens
            raw_workers["vllm"] = vllm
            if workers.engine != "vllm" and o.workers is None:
                raw_workers["count"] = 1  # one engine unless asked for more
            changes["model"] = vllm.get("model", "tiny")
        raw_workers["step_model"] = workers.step_model
        workers = parse_workers(raw_workers, "command line")
        changes["workers"] = workers
    if o.workers is not None:
        if o.workers < 1:
            raise ConfigError("--workers must be at least 1")
        changes["workers"] = dataclasses.replace(workers, count=o.workers)
    if o.policy is not None:
        try:
            parsed = parse_policy(o.policy)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        changes["scheduler"] = {**config.scheduler, "policy": dataclasses.asdict(parsed)}
    return dataclasses.replace(config, **changes)


def _place_on_gpus(config: GatewayConfig) -> GatewayConfig:
    """vLLM workers on a machine with GPUs get one each, unless the configuration says otherwise."""
    import ray

    if config.workers.engine == "vllm" and config.workers.num_gpus == 0 and ray.cluster_resources().get("GPU", 0):
        return dataclasses.replace(config, workers=dataclasses.replace(config.workers, num_gpus=1.0))
    return config


def _kill_dispatcher(name: str) -> None:
    import ray

    with contextlib.suppress(ValueError):
        actor = ray.get_actor(name, namespace="fairgate")
        with contextlib.suppress(Exception):  # save the counters one last time (Redis), then stop
            ray.get(actor.shutdown.remote(), timeout=15)
        ray.kill(actor)
