"""The application builder for Ray Serve configs (``deploy/serve.yaml``, the KubeRay ``serveConfigV2``).

``serve run`` / ``serve deploy`` call ``build(args)``. Nothing secret is in the Serve config: the gateway
configuration (tenants and their API keys) is a file named by ``args.config`` or ``FAIRGATE_CONFIG``
(mounted from a Kubernetes Secret), and the admin key, the cluster secret and the Redis URL come from
``FAIRGATE_ADMIN_KEY``, ``FAIRGATE_CLUSTER_SECRET`` and ``FAIRGATE_REDIS_URL`` (or their ``*_FILE`` forms).
"""

from __future__ import annotations

import os
from typing import Any

from fairgate.common.sections import ConfigError, secret_from_env
from fairgate.gateway.config import load_config
from fairgate.gateway.config_schema import ADMIN


def build(args: dict[str, Any]):
    from fairgate.gateway.app import build_app

    path = args.get("config") or os.environ.get("FAIRGATE_CONFIG") or None
    config, generated = load_config(path)
    missing = sorted(name for name in generated if name != ADMIN)
    if missing:
        raise ConfigError(f"a deployed gateway needs an api_key for every tenant in its config; missing: {missing}")
    if ADMIN in generated:
        raise ConfigError("a deployed gateway needs an admin key: set FAIRGATE_ADMIN_KEY or FAIRGATE_ADMIN_KEY_FILE")
    secret = secret_from_env("FAIRGATE_CLUSTER_SECRET")
    if not secret:
        raise ConfigError("set FAIRGATE_CLUSTER_SECRET (or FAIRGATE_CLUSTER_SECRET_FILE)")
    return build_app(str(args.get("app_name", "fairgate")), config, secret)
