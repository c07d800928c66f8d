"""The shards' settings: ``shards:`` in the configuration and ``fairgate serve --dispatchers``, checked
with clear errors (quotas are one dispatcher's: not with several shards yet)."""

from __future__ import annotations

import pytest

from fairgate.cli.serve import ServeOverrides, _override
from fairgate.common.sections import ConfigError
from fairgate.gateway.config import load_config, parse_config

BASE = {"tenants": [{"name": "alice", "api_key": "a" * 20}], "admin_api_key": "fg-admin-" + "x" * 20}
QUOTA = [{"node": "alice", "window": "hour", "max_tokens": 5000}]


def test_the_configuration_sets_the_shards_and_checks_them():
    config, _ = parse_config({**BASE, "shards": {"count": 4, "tau_s": 0.2}})
    assert (config.shards.count, config.shards.tau_s) == (4, 0.2)
    assert parse_config(BASE)[0].shards.count == 1
    for shards, needle in (
        ({"count": 0}, "shards.count"),
        ({"count": 65}, "shards.count"),
        ({"tau_s": 0}, "shards.tau_s"),
        ({"count": 2, "tau": 0.1}, "tau"),
    ):
        with pytest.raises(ConfigError, match=needle):
            parse_config({**BASE, "shards": shards})
    with pytest.raises(ConfigError, match="quotas are kept by one dispatcher"):
        parse_config({**BASE, "quotas": QUOTA, "shards": {"count": 2}})


def test_serve_dispatchers_sets_the_count_and_refuses_what_it_cannot_run():
    default, _ = load_config(None)
    assert _override(default, ServeOverrides(dispatchers=3)).shards.count == 3
    for bad in (0, 65):
        with pytest.raises(ConfigError, match="--dispatchers must be between 1 and 64"):
            _override(default, ServeOverrides(dispatchers=bad))
    with_quota, _ = parse_config({**BASE, "quotas": QUOTA})
    with pytest.raises(ConfigError, match="--dispatchers: quotas"):
        _override(with_quota, ServeOverrides(dispatchers=2))
    assert _override(with_quota, ServeOverrides(dispatchers=1)).shards.count == 1
