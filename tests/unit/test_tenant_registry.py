"""The tenant registry's rules, and the ingress's key cache."""

import pytest

from dispatcher.tenant_registry import TenantError, TenantRegistry
from ingress.auth import KeyCache, LookupBudget


@pytest.mark.parametrize("name", ["alice\n", "alice\r\n", "", "-alice", "a" * 65, "al ice", "alice/x"])
def test_a_tenant_name_must_be_a_plain_name_from_end_to_end(name):
    with pytest.raises(TenantError) as err:
        TenantRegistry([]).create(name, "hash", 1.0)
    assert err.value.status == 400


def test_a_full_key_cache_forgets_its_oldest_entries_not_every_valid_key():
    cache = KeyCache({"h-valid": "alice"}, max_entries=100)
    assert cache.get("h-valid") == (True, "alice")
    for i in range(1000):  # a flood of unknown keys
        cache.put(f"h-unknown-{i}", None)
        cache.get("h-valid")  # alice keeps using hers: it stays
    assert cache.get("h-valid") == (True, "alice")
    assert len(cache) == 100


def test_unknown_keys_cost_at_most_the_budget_of_dispatcher_lookups():
    budget = LookupBudget(per_s=10.0, burst=5)
    granted = sum(budget.take(now=0.0) for _ in range(100))
    assert granted == 5
    assert budget.take(now=0.05) is False and budget.take(now=0.1) is True  # 10 a second come back
