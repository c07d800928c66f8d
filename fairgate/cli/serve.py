"""``fairgate serve``: the whole gateway on this machine (local Ray kept on loopback, simulated workers
by default, in-memory state), stopped cleanly by Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import secrets
import signal
import threading
from typing import TYPE_CHECKING, Any

from fairgate.cli.parsing import UsageError
from fairgate.core import make_policy, policy_usages

if TYPE_CHECKING:
    from fairgate.common.config import GatewayConfig


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from fairgate.workers.engines import engine_names

    srv = sub.add_parser("serve", help="start the gateway on this machine (local Ray, simulated workers)")
    srv.add_argument("--config", help="gateway YAML (default: the embedded configuration)")
    srv.add_argument("--workers", type=int, help="number of worker replicas")
    srv.add_argument("--policy", help=f"scheduling policy, one of {', '.join(policy_usages())}")
    srv.add_argument("--port", type=int, default=8000, help="HTTP port on 127.0.0.1")
    srv.add_argument("--engine", choices=engine_names(), help="worker engine (default: the config's)")
    srv.add_argument(
        "--model", help="vLLM model: a shape the project builds (tiny, llama3-8b; dummy weights), a path or an HF id"
    )
    srv.add_argument("--kv-tokens", type=int, help="KV pool per worker, in tokens")
    srv.add_argument(
        "--dispatchers", type=int, help="dispatcher shards, each over a slice of the workers (docs/shards.md)"
    )
    srv.add_argument(
        "--front-door",
        choices=("direct", "haproxy", "serve"),
        help="the ingress replicas' own HTTP server (default), Ray Serve's HAProxy ingress or Serve's Python "
        "HTTP proxy (or FAIRGATE_FRONT_DOOR)",
    )
    return srv


def run(args: argparse.Namespace) -> int:
    import os

    from fairgate.common.loopback import FRONT_DOOR_ENV, ray_environment

    if args.front_door:
        os.environ[FRONT_DOOR_ENV] = args.front_door
    ray_environment()  # before anything imports Ray: it reads these at import time
    from fairgate.common.sections import ConfigError

    if not 1 <= args.port <= 65535:
        raise UsageError("--port must be between 1 and 65535")
    try:
        overrides = ServeOverrides(args.workers, args.policy, args.engine, args.model, args.kv_tokens, args.dispatchers)
        return serve_main(args.config, overrides, args.port)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


@dataclasses.dataclass(frozen=True)
class ServeOverrides:
    """Command-line flags that override the configuration file."""

    workers: int | None = None
    policy: str | None = None
    engine: str | None = None
    model: str | None = None
    kv_tokens: int | None = None
    dispatchers: int | None = None


def serve_main(config_path: str | None, overrides: ServeOverrides, port: int) -> int:
    from fairgate.common.key_hashing import SECRET_ENV as KEY_HASH_SECRET_ENV
    from fairgate.common.sections import ConfigError, checked_cluster_secret, secret_from_env
    from fairgate.gateway.config import load_config
    from fairgate.gateway.config_schema import ADMIN

    config, generated_keys = load_config(config_path)
    config = _override(config, overrides)
    given = secret_from_env("FAIRGATE_CLUSTER_SECRET")
    if config.state.redis_url and not given and not secret_from_env(KEY_HASH_SECRET_ENV):
        raise ConfigError(
            "state.redis_url keeps tenants' key hashes across restarts: set FAIRGATE_CLUSTER_SECRET or"
            f" {KEY_HASH_SECRET_ENV} (at least 32 characters) so that they stay valid from one run to the next"
        )
    secret = checked_cluster_secret(given) if given else secrets.token_hex(32)  # else one per run

    from ray import serve

    from fairgate.dispatcher.actor import dispatcher_name
    from fairgate.dispatcher.names import rounds_name
    from fairgate.gateway.app import run_app, start_local_ray

    start_local_ray()
    config = _place_on_gpus(config)
    url = run_app("fairgate", config, secret, port)
    from fairgate.common.loopback import front_door

    pools = ", ".join(f"{m.name!r} ({m.workers.count} {m.workers.engine} workers)" for m in config.models)
    how = f"policy {config.scheduler.policy}, front door {front_door()}"
    if config.shards.count > 1:
        how += f", {config.shards.count} dispatcher shards"
    print(f"fairgate is serving {pools} at {url}/v1 ({how})")
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
    for shard in range(config.shards.count):
        _kill_dispatcher(dispatcher_name("fairgate", shard))
    if config.shards.count > 1:
        _kill_dispatcher(rounds_name("fairgate"))
    import ray

    ray.shutdown()
    return 0


def _override(config: GatewayConfig, o: ServeOverrides) -> GatewayConfig:
    from fairgate.common.sections import ConfigError
    from fairgate.gateway.config import with_engine
    from fairgate.workers.engines import engine_for, engine_names

    changes: dict[str, Any] = {}
    workers = config.workers
    if o.engine is not None or o.model is not None or o.kv_tokens is not None:
        if o.kv_tokens is not None and o.kv_tokens < 1:
            raise ConfigError("--kv-tokens must be at least 1")
        name = o.engine or workers.engine
        if o.engine is None and o.model is not None and not engine_for(name).serves_models:
            name = next(n for n in engine_names() if engine_for(n).serves_models)  # --model asks for a model
        engine = engine_for(name)
        try:
            settings = engine.override(workers.settings, model=o.model, kv_tokens=o.kv_tokens)
        except ValueError as exc:
            raise ConfigError(f"command line: {exc}") from None
        switched = name != workers.engine
        config = with_engine(config, name, {**workers.settings, **settings}, "command line")
        workers = config.workers
        if switched and engine.default_replicas and o.workers is None:
            workers = workers.model_copy(update={"count": engine.default_replicas})  # unless asked for more
        changes["workers"] = workers
        if engine.serves_models:
            changes["model"] = engine.served_model(workers.settings) or config.model
    if o.workers is not None:
        if o.workers < 1:
            raise ConfigError("--workers must be at least 1")
        changes["workers"] = workers.model_copy(update={"count": o.workers})
    if o.policy is not None:
        try:
            changes["scheduler"] = dataclasses.replace(config.scheduler, policy=make_policy(o.policy).spec)
        except ValueError as exc:
            raise ConfigError(f"--policy: {exc}") from None
    if o.dispatchers is not None:
        if not 1 <= o.dispatchers <= 64:
            raise ConfigError("--dispatchers must be between 1 and 64")
        if config.quotas and o.dispatchers > 1:
            raise ConfigError("--dispatchers: quotas are kept by one dispatcher; shards do not support them yet")
        changes["shards"] = config.shards.model_copy(update={"count": o.dispatchers})
    config = config.with_first(model=changes.pop("model", None), workers=changes.pop("workers", None))
    return config.model_copy(update=changes)


def _place_on_gpus(config: GatewayConfig) -> GatewayConfig:
    """Workers of an engine that uses GPUs get one each on a machine with GPUs, unless the
    configuration says otherwise."""
    import ray

    from fairgate.workers.engines import engine_for

    if not ray.cluster_resources().get("GPU", 0):
        return config
    models = []
    for m in config.models:
        w = m.workers
        if engine_for(w.engine).uses_gpus and w.num_gpus == 0:
            m = m.model_copy(update={"workers": w.model_copy(update={"num_gpus": 1.0})})
        models.append(m)
    return config.with_models(models)


def _kill_dispatcher(name: str) -> None:
    import ray

    with contextlib.suppress(ValueError):
        actor = ray.get_actor(name, namespace="fairgate")
        with contextlib.suppress(Exception):  # save the counters one last time (Redis), then stop
            ray.get(actor.shutdown.remote(), timeout=15)
        ray.kill(actor)
