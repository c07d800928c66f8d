"""The registry of LoRA adapters: who may use each (the tenant tree's nodes), and the changes it
refuses whole (unknown base model, a pool without adapter slots, a node that does not exist, a name
taken), as the admin API and the configuration both check them."""

from __future__ import annotations

import pytest

from fairgate.common.sections import ConfigError
from fairgate.dispatcher.adapter_registry import AdapterRecord, AdapterRegistry
from fairgate.dispatcher.tenant_registry import TenantError, TenantRegistry
from fairgate.gateway.config import deployable, parse_config

TENANTS = [
    {"name": "alice", "key_hash": "a", "parent": "support"},
    {"name": "bob", "key_hash": "b", "parent": "sales"},
    {"name": "carol", "key_hash": "c"},
]
NODES = [{"name": "org"}, {"name": "support", "parent": "org"}, {"name": "sales", "parent": "org"}]
MODELS = {"base": True, "plain": False}


def registries() -> tuple[AdapterRegistry, TenantRegistry]:
    tenants = TenantRegistry(TENANTS, NODES)
    adapters = AdapterRegistry([], MODELS)
    for name, nodes in (("team", ["support"]), ("org-wide", ["org"]), ("everyone", [""]), ("carols", ["carol"])):
        adapters.create(AdapterRecord(name, "base", f"/w/{name}", nodes), tenants.known)
    return adapters, tenants


def usable(adapters: AdapterRegistry, tenants: TenantRegistry, tenant: str) -> set[str]:
    return {r.name for r in adapters.usable_by(tenants.ancestry(tenant))}


def test_a_tenant_may_use_the_adapters_of_its_nodes_up_to_the_root():
    adapters, tenants = registries()
    assert tenants.ancestry("alice") == ["alice", "support", "org", ""]
    assert usable(adapters, tenants, "alice") == {"team", "org-wide", "everyone"}
    assert usable(adapters, tenants, "bob") == {"org-wide", "everyone"}
    assert usable(adapters, tenants, "carol") == {"everyone", "carols"}
    assert usable(adapters, tenants, "nobody") == {"everyone"}  # unknown keys never get this far


@pytest.mark.parametrize(
    ("record", "status", "words"),
    [
        (AdapterRecord("x", "missing", "/w", ["org"]), 400, "no model 'missing'"),
        (AdapterRecord("x", "plain", "/w", ["org"]), 400, "no adapter slots"),
        (AdapterRecord("x", "base", "/w", ["ghost"]), 400, "no tree node or tenant 'ghost'"),
        (AdapterRecord("x", "base", "/w", []), 400, "nodes must list"),
        (AdapterRecord("x", "base", "", ["org"]), 400, "path"),
        (AdapterRecord("team", "base", "/w", ["org"]), 409, "already exists"),
        (AdapterRecord("base", "base", "/w", ["org"]), 409, "a model's name"),
        (AdapterRecord("bad name", "base", "/w", ["org"]), 400, "adapter names"),
    ],
)
def test_refused_changes_change_nothing(record, status, words):
    adapters, tenants = registries()
    before = adapters.records()
    with pytest.raises(TenantError, match=words) as refused:
        adapters.create(record, tenants.known)
    assert refused.value.status == status
    with pytest.raises(TenantError):
        adapters.update("team", None, ["ghost"], tenants.known)
    with pytest.raises(TenantError) as missing:
        adapters.delete("ghost")
    assert missing.value.status == 404
    assert adapters.records() == before


def test_an_update_moves_an_adapter_between_nodes_and_paths():
    adapters, tenants = registries()
    changed = adapters.update("team", "/w/team-v2", ["sales", "sales"], tenants.known)
    assert (changed.path, changed.nodes) == ("/w/team-v2", ["sales"])
    assert "team" in usable(adapters, tenants, "bob") and "team" not in usable(adapters, tenants, "alice")


CONFIG = {
    "tenants": [{"name": "alice", "api_key": "k" * 16}],
    "admin_api_key": "admin" * 4,
    "workers": {"max_loras": 2},
}


def test_the_configuration_checks_adapters_as_the_admin_api_does():
    config, _ = parse_config(
        {**CONFIG, "adapters": [{"name": "a1", "base_model": "fairgate-sim", "path": "/w", "nodes": ["alice"]}]}
    )
    assert [a.model_dump() for a in config.adapters] == [
        {"name": "a1", "base_model": "fairgate-sim", "path": "/w", "nodes": ["alice"]}
    ]
    assert deployable(config, "s" * 32).adapter_models == {"fairgate-sim": True}
    for adapter, words in (
        ({"name": "a1", "base_model": "other", "path": "/w", "nodes": ["alice"]}, "no model 'other'"),
        ({"name": "a1", "base_model": "fairgate-sim", "path": "/w", "nodes": ["bob"]}, "no tree node or tenant 'bob'"),
        ({"name": "a1", "base_model": "fairgate-sim", "path": "/w"}, "nodes"),
    ):
        with pytest.raises(ConfigError, match=words):
            parse_config({**CONFIG, "adapters": [adapter]})
    without_slots = {**CONFIG, "workers": {}}
    with pytest.raises(ConfigError, match="no adapter slots"):
        parse_config(
            {**without_slots, "adapters": [{"name": "a1", "base_model": "fairgate-sim", "path": "/w", "nodes": [""]}]}
        )
