"""API keys as keyed hashes: what a store or Ray's GCS holds cannot be checked against guesses without
the secret, the same key keeps working when a store written before is upgraded, and processes that
would hash alike refuse to start when they would not."""

from __future__ import annotations

import pytest
import yaml

from fairgate.common.key_hashing import KEYED_PREFIX, SECRET_ENV, KeyHasher, key_digest
from fairgate.common.sections import ConfigError
from fairgate.gateway.app import build_app
from fairgate.gateway.config import parse_config

CLUSTER = "c" * 32


def _config():
    with open("gateway/default_config.yaml") as f:
        raw = yaml.safe_load(f)
    raw["tenants"] = [
        {"name": "alice", "api_key": "alice-weak-key-1234"},
        {"name": "bob", "api_key": "bob-weak-key-12345"},
    ]
    raw["admin_api_key"] = "admin-weak-key-123456"
    return parse_config(raw)[0]


def test_a_keyed_hash_needs_the_secret_and_an_upgraded_digest_matches_the_key(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    hasher = KeyHasher.from_environment(CLUSTER)
    keyed = hasher.of_key("alice-weak-key-1234")
    assert keyed.startswith(KEYED_PREFIX) and key_digest("alice-weak-key-1234") not in keyed
    assert KeyHasher.from_environment("d" * 32).of_key("alice-weak-key-1234") != keyed  # another secret
    assert hasher.upgrade(key_digest("alice-weak-key-1234")) == keyed  # a stored digest, upgraded in place
    assert hasher.upgrade(keyed) == keyed and hasher.upgrade("") == ""


def test_the_secret_set_apart_wins_over_the_cluster_secret_and_must_be_long(monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "k" * 32)
    given = KeyHasher.from_environment(CLUSTER)
    assert given.of_key("x" * 20) == KeyHasher.from_environment("d" * 32).of_key("x" * 20)
    monkeypatch.delenv(SECRET_ENV)
    assert KeyHasher.from_environment(CLUSTER).of_key("x" * 20) != given.of_key("x" * 20)
    monkeypatch.setenv(SECRET_ENV, "short")
    with pytest.raises(ConfigError, match="at least 32"):
        KeyHasher.from_environment(CLUSTER)


def test_a_process_hashing_with_another_secret_refuses_to_start(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    built = KeyHasher.from_environment(CLUSTER).fingerprint()
    KeyHasher.from_environment(CLUSTER).check_fingerprint(built, "ingress")
    monkeypatch.setenv(SECRET_ENV, "k" * 32)
    with pytest.raises(ConfigError, match="ingress: FAIRGATE_KEY_HASH_SECRET differs"):
        KeyHasher.from_environment(CLUSTER).check_fingerprint(built, "ingress")


def test_what_the_app_is_built_from_holds_no_plain_digest_of_any_key(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    config = _config()
    ingress = build_app("keys", config, CLUSTER)._bound_deployment
    given = repr((ingress.init_args, ingress.init_kwargs))
    hasher = KeyHasher.from_environment(CLUSTER)
    for key in ("alice-weak-key-1234", "bob-weak-key-12345", "admin-weak-key-123456"):
        assert key_digest(key) not in given and key not in given
        assert hasher.of_key(key) in given
    assert ingress.init_args[1].key_hash_fingerprint == hasher.fingerprint()


def test_a_local_gateway_keeping_tenants_in_redis_needs_a_stable_secret(monkeypatch, tmp_path):
    """A per-run cluster secret would key the hashes kept in Redis differently at each start: every
    stored key would be refused after a restart. Refused before Ray starts."""
    from fairgate.cli.serve import ServeOverrides, serve_main

    for name in ("FAIRGATE_CLUSTER_SECRET", "FAIRGATE_CLUSTER_SECRET_FILE", SECRET_ENV, SECRET_ENV + "_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAIRGATE_REDIS_URL", "redis://127.0.0.1:1/0")
    with pytest.raises(ConfigError, match="keeps tenants' key hashes across restarts"):
        serve_main(None, ServeOverrides(), 8000)
