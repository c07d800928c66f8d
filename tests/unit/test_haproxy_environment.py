"""Two Ray clusters with the HAProxy front door on one machine (two gateways, or a test beside a
session's) each get listeners of their own: HAProxy's stats and metrics, and Serve's fallback proxy,
where HAProxy sends what no replica can take yet. On the fallback's default port (8500) both clusters'
proxies listened at once, and one cluster's requests were answered by the other's gateway (a 401 for
a key the other did not know)."""

from __future__ import annotations

import shutil

from fairgate.common.loopback import HAPROXY_DIR_ENV, haproxy_environment

PORTS = (
    "RAY_SERVE_HAPROXY_METRICS_PORT",
    "RAY_SERVE_HAPROXY_STATS_PORT",
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
)


def test_each_cluster_gets_its_own_folder_and_ports():
    first, second = haproxy_environment(), haproxy_environment()
    try:
        assert first[HAPROXY_DIR_ENV] != second[HAPROXY_DIR_ENV]
        for env in (first, second):
            assert all(int(env[key]) > 0 for key in PORTS)
        assert "8500" not in (first["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"], second["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"])
    finally:
        for env in (first, second):
            shutil.rmtree(env[HAPROXY_DIR_ENV], ignore_errors=True)
