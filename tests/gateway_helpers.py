"""Deploying gateway applications on the session's Serve instance, for end-to-end tests."""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve

from dispatcher.actor import dispatcher_name
from dispatcher.app import build_app
from dispatcher.config import GatewayConfig, parse_config


@dataclass
class Gateway:
    name: str
    base_url: str
    keys: dict[str, str]
    config: GatewayConfig
    secret: str
    raw: dict[str, Any]

    def stats(self) -> dict[str, Any]:
        actor = ray.get_actor(dispatcher_name(self.name), namespace="fairgate")
        return ray.get(actor.stats.remote())

    def redeploy(self, workers: int) -> None:
        raw = dict(self.raw, workers={**self.raw["workers"], "count": workers})
        config, _ = parse_config(raw)
        serve.run(build_app(self.name, config, self.secret), name=self.name, route_prefix=f"/{self.name}")

    def delete(self) -> None:
        serve.delete(self.name)
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(dispatcher_name(self.name), namespace="fairgate"))


def deploy(
    name: str,
    port: int,
    *,
    policy: str = "vtc",
    workers: int = 2,
    kv_tokens: int = 4000,
    step_s: float = 0.01,
    tenants: tuple[str, ...] = ("alice", "bob", "carol"),
    max_body_bytes: int = 65536,
    max_model_len: int = 4096,
) -> Gateway:
    keys = {t: "fg-test-" + secrets.token_hex(12) for t in tenants}
    raw = {
        "model": "fairgate-sim",
        "policy": policy,
        "workers": {
            "count": workers,
            "kv_tokens": kv_tokens,
            "block_size": 1,
            "step_model": {
                "step_overhead_s": step_s,
                "prefill_per_token_s": 0.0,
                "decode_per_seq_s": 0.0,
                "decode_per_ctx_token_s": 0.0,
            },
        },
        "ingress": {"max_body_bytes": max_body_bytes, "max_model_len": max_model_len, "default_max_tokens": 16},
        "tenants": [{"name": t, "api_key": k} for t, k in keys.items()],
    }
    config, _ = parse_config(raw)
    secret = secrets.token_hex(16)
    serve.run(build_app(name, config, secret), name=name, route_prefix=f"/{name}")
    return Gateway(name, f"http://127.0.0.1:{port}/{name}/v1", keys, config, secret, raw)
