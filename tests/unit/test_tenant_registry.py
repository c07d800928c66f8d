"""The tenant registry's rules, and the ingress's key cache."""

import pytest

from fairgate.dispatcher.tenant_registry import TenantError, TenantRegistry
from fairgate.ingress.auth import KeyCache, LookupBudget


@pytest.mark.parametrize("name", ["alice\n", "alice\r\n", "", "-alice", "a" * 65, "al ice", "alice/x"])
def test_a_tenant_name_must_be_a_plain_name_from_end_to_end(name):
    with pytest.raises(TenantError) as err:
        TenantRegistry([]).create(name, "hash", 1.0)
    assert err.value.status == 400


def test_a_flood_of_unknown_keys_pushes_out_only_other_unknown_keys():
    cache = KeyCache({"h-valid": "alice"}, max_unknown=100)
    for i in range(1000):  # a flood of unknown keys, alice idle all along
        cache.put(f"h-unknown-{i}", None, now=0.0)
    assert cache.get("h-valid", now=0.0) == (True, "alice", False)
    assert cache.get("h-unknown-999", now=0.0) == (True, None, False)
    assert cache.get("h-unknown-0", now=0.0) == (False, None, False)  # the oldest refused keys went
    assert len(cache) == 101


def test_a_known_key_past_its_time_is_used_while_it_is_renewed():
    """Renewal never waits for the unknown-key budget: an expired known answer stays usable (stale),
    while an expired refusal must be asked again."""
    cache = KeyCache({}, ttl_s=5.0)
    cache.put("h-valid", "alice", now=0.0)
    cache.put("h-bad", None, now=0.0)
    assert cache.get("h-valid", now=1.0) == (True, "alice", False)
    assert cache.get("h-valid", now=6.0) == (True, "alice", True)
    assert cache.get("h-bad", now=6.0) == (False, None, False)
    cache.put("h-valid", None, now=6.0)  # revoked: the renewal says so, and it is refused from then on
    assert cache.get("h-valid", now=7.0) == (True, None, False)
    cache.put("h-valid", "bob", now=7.0)
    cache.forget_tenant("bob")
    assert cache.get("h-valid", now=7.0) == (False, None, False)


def test_unknown_keys_cost_at_most_the_budget_of_dispatcher_lookups():
    budget = LookupBudget(per_s=10.0, burst=5)
    granted = sum(budget.take(now=0.0) for _ in range(100))
    assert granted == 5
    assert budget.take(now=0.05) is False and budget.take(now=0.1) is True  # 10 a second come back


@pytest.mark.parametrize("tier", [None, "", "auto", "default"])
def test_without_classes_the_one_tier_is_served(tier):
    assert TenantRegistry([]).class_for("alice", tier) == ("", "")


@pytest.mark.parametrize("tier", ["flex", "priority", "scale", "gold"])
def test_without_classes_a_request_naming_another_tier_is_refused(tier):
    with pytest.raises(TenantError) as err:
        TenantRegistry([]).class_for("alice", tier)
    assert err.value.status == 400 and tier in str(err.value)
