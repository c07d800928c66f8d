"""What each worker replica is given: never the state store's address or password, nor a tenant's
key hash (a worker pod runs untrusted models and needs none of them; it finds the dispatcher by
name instead of creating it from the dispatcher's settings)."""

from __future__ import annotations

import yaml

from fairgate.gateway.app import build_app
from fairgate.gateway.config import parse_config

PASSWORD = "hunter2-not-for-workers"


def test_a_worker_replicas_init_arguments_hold_no_store_address_password_or_key_hash():
    with open("gateway/default_config.yaml") as f:
        raw = yaml.safe_load(f)
    raw["state"] = {"redis_url": f"redis://:{PASSWORD}@10.0.0.5:6379/0"}
    raw["models"] = [{"name": "a"}, {"name": "b"}]
    raw.pop("model", None)
    raw.pop("workers", None)
    config, _ = parse_config(raw)
    ingress = build_app("args", config, "s" * 32)._bound_deployment
    pools = ingress.init_args[3]
    assert len(pools) == 2
    gateway = ingress.init_args[1]
    hashes = [t.key_hash for t in gateway.tenants] + [gateway.admin_key_hash]
    assert PASSWORD in repr(ingress.init_args)  # the ingress creates the dispatcher: it holds them
    for pool in pools:
        given = repr((pool._bound_deployment.init_args, pool._bound_deployment.init_kwargs))
        assert PASSWORD not in given and "redis" not in given and "10.0.0.5" not in given
        assert not any(h in given for h in hashes)
