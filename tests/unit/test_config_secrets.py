"""Secrets come from the environment or mounted files, never from constants in the code."""

from __future__ import annotations

import pytest

from fairgate.common.key_hashing import key_digest
from fairgate.common.sections import ConfigError, secret_from_env
from fairgate.gateway.config import parse_config
from fairgate.gateway.config_schema import ADMIN

TENANTS = {"tenants": [{"name": "a", "api_key": "tenant-key-0123456789"}]}


def test_admin_key_is_generated_per_start_when_none_is_given(monkeypatch):
    monkeypatch.delenv("FAIRGATE_ADMIN_KEY", raising=False)
    monkeypatch.delenv("FAIRGATE_ADMIN_KEY_FILE", raising=False)
    first, generated = parse_config(TENANTS)
    _, again = parse_config(TENANTS)
    assert generated[ADMIN] != again[ADMIN] and first.admin_key_hash == key_digest(generated[ADMIN])


def test_admin_key_from_a_mounted_file(monkeypatch, tmp_path):
    path = tmp_path / "admin-key"
    path.write_text("admin-key-from-a-secret-volume\n")
    monkeypatch.delenv("FAIRGATE_ADMIN_KEY", raising=False)
    monkeypatch.setenv("FAIRGATE_ADMIN_KEY_FILE", str(path))
    config, generated = parse_config(TENANTS)
    assert ADMIN not in generated and config.admin_key_hash == key_digest("admin-key-from-a-secret-volume")
    monkeypatch.setenv("FAIRGATE_ADMIN_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="FAIRGATE_ADMIN_KEY_FILE"):
        secret_from_env("FAIRGATE_ADMIN_KEY")


@pytest.mark.parametrize(
    ("admin", "needle"), [("short", "at least 16"), ("tenant-key-0123456789", "differ from every tenant")]
)
def test_bad_admin_keys_are_refused(monkeypatch, admin, needle):
    monkeypatch.setenv("FAIRGATE_ADMIN_KEY", admin)
    with pytest.raises(ConfigError, match=needle):
        parse_config(TENANTS)


def test_a_short_cluster_secret_is_refused_wherever_the_gateway_is_built(monkeypatch):
    """``fairgate serve`` and a deployment alike: every ticket and hop key derives from it."""
    import yaml

    from fairgate.common.sections import checked_cluster_secret
    from fairgate.gateway.app import build_app

    assert checked_cluster_secret("x" * 32) == "x" * 32
    with pytest.raises(ConfigError, match="at least 32"):
        checked_cluster_secret("short-secret")
    with open("gateway/default_config.yaml") as f:
        config, _ = parse_config(yaml.safe_load(f))
    with pytest.raises(ConfigError, match="at least 32"):
        build_app("short", config, "0123456789")
