"""Token quotas, counted in the core: a request is admitted only if its largest possible use fits what
is left, held while it runs and replaced by its actual use when it ends; so whatever arrives, in
whatever order, no quota's window ever uses more than its maximum."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairgate.core import FairScheduler, LinearCost, SchedulerConfig
from fairgate.core.quotas import Amount, Prices, QuotaBook, QuotaRule
from fairgate.core.reasons import REJECT_QUOTA
from fairgate.gateway.config import parse_config

HOUR = 3600.0
# alice's hourly 1,000-token quota once 150 are used and nothing is held (its reset time left out)
ALICE_USED_150 = {
    "node": "alice",
    "window": "hour",
    "max_tokens": 1000,
    "max_cost": None,
    "over": "reject",
    "min_tokens": None,
    "min_cost": None,
    "used_tokens": 150,
    "held_tokens": 0,
    "remaining_tokens": 850,
    "used_cost": 0.0,
    "held_cost": 0.0,
    "resets_in_s": 0,
}


def scheduler(*rules: QuotaRule, **config) -> FairScheduler:
    s = FairScheduler(SchedulerConfig(cost=LinearCost(1.0, 2.0), **config), QuotaBook(rules))
    s.worker_join("w", kv_tokens=10_000)
    return s


def run(s: FairScheduler, rid: str, tenant: str, prompt: int, max_tokens: int, output: int, now: float) -> str | None:
    """Submit, assign, start and finish one request with ``output`` tokens; the submission's answer."""
    refused = s.submit(rid, tenant, prompt, max_tokens, now)
    if refused:
        return refused
    s.assign(now)
    s.on_report("w", {rid: output}, started={rid: prompt})
    s.on_finish(rid, output, "stop", now)
    return None


def test_a_request_that_could_take_a_quota_over_is_refused_with_when_its_window_turns():
    s = scheduler(QuotaRule("alice", "hour", 1000))
    assert run(s, "a1", "alice", 100, 500, 50, 10.0) is None  # held 600, used 150 once it ended
    assert s.quotas.view(["alice"], 10.0)[0] | {"resets_in_s": 0} == ALICE_USED_150
    assert s.submit("a2", "alice", 100, 800, 20.0) == REJECT_QUOTA  # 900 > 850 left
    assert s.last_refusal.left == "850 tokens" and s.last_refusal.retry_after_s == pytest.approx(HOUR - 20.0)
    assert s.submit("b1", "bob", 100, 800, 20.0) is None  # bob has no quota
    assert run(s, "a3", "alice", 100, 750, 750, 21.0) is None  # 850 fits exactly, and is used
    assert s.submit("a4", "alice", 1, 1, 22.0) == REJECT_QUOTA  # nothing left ...
    assert run(s, "a5", "alice", 1, 1, 1, HOUR + 1.0) is None  # ... until the hour turns


def test_a_money_quota_holds_the_most_a_request_may_cost_and_counts_what_it_did():
    """Prices per million tokens: prompt 2, cached prompt 0.5, output 8. A request of 1,000 prompt
    tokens and up to 500 output holds 0.006 (none of its prompt cached, all its output); it used 800
    cached prompt tokens and 100 output: 0.0004 + 0.0004 + 0.0008."""
    s = FairScheduler(
        SchedulerConfig(cost=LinearCost(1.0, 2.0)),
        QuotaBook([QuotaRule("alice", "day", max_cost=0.01)]),
        Prices(input=2.0, cached_input=0.5, output=8.0),
    )
    s.worker_join("w", kv_tokens=10_000)
    assert s.submit("a1", "alice", 1000, 500, 0.0) is None
    s.assign(0.0)
    assert s.quotas.view(["alice"], 0.0)[0]["held_cost"] == pytest.approx(0.006)
    assert s.submit("a2", "alice", 1000, 500, 0.0) == REJECT_QUOTA  # 0.006 more would exceed 0.01
    assert "in money" in s.last_refusal.left
    s.on_report("w", {"a1": 100}, started={"a1": 1000}, cached={"a1": 800})
    s.on_finish("a1", 100, "stop", 1.0)
    row = s.quotas.view(["alice"], 1.0)[0]
    assert row["used_cost"] == pytest.approx(0.0016) and row["held_cost"] == 0
    assert row["remaining_cost"] == pytest.approx(0.0084) and row["used_tokens"] == 1100
    assert s.submit("a2", "alice", 1000, 500, 2.0) is None


def test_requests_running_hold_their_largest_use_and_a_refund_gives_it_back():
    s = scheduler(QuotaRule("alice", "minute", 1000))
    assert s.submit("a1", "alice", 100, 500, 0.0) is None
    s.assign(0.0)
    assert s.quotas.view(["alice"], 0.0)[0]["held_tokens"] == 600
    assert s.submit("a2", "alice", 100, 400, 0.0) == REJECT_QUOTA  # 500 > 400 left while a1 runs
    assert s.requeue("a1")  # its worker could not be reached: back in its queue, its hold released
    assert s.quotas.view(["alice"], 0.0)[0]["held_tokens"] == 0


def test_queued_requests_that_together_exceed_what_is_left_are_refused_at_dispatch():
    """Each fits on its own when it arrives; the second no longer fits when its turn comes."""
    s = scheduler(QuotaRule("alice", "hour", 1000))
    assert s.submit("a1", "alice", 100, 500, 0.0) is None
    assert s.submit("a2", "alice", 100, 500, 0.0) is None
    assigned = s.assign(0.0)
    assert [a.request.id for a in assigned] == ["a1"]
    assert [(r.id, reason) for r, reason in s.take_dropped()] == [("a2", REJECT_QUOTA)]


def test_a_tree_nodes_quota_counts_every_tenant_under_it_and_every_class():
    classes = ({"name": "interactive"}, {"name": "batch"})
    from fairgate.core.classes import RequestClass

    s = scheduler(QuotaRule("team", "day", 1000), classes=tuple(RequestClass.from_dict(c) for c in classes))
    s.set_node("team", None, 1.0)
    s.add_tenant("alice", 1.0, "team")
    s.add_tenant("bob", 1.0, "team")
    assert run(s, "a1", "alice", 200, 300, 300, 0.0) is None  # 500 used
    s.submit("b1", "bob", 100, 300, 0.0, klass="batch")
    s.assign(0.0)  # 400 held by bob's batch class
    assert s.submit("a2", "alice", 50, 51, 0.0) == REJECT_QUOTA  # 101 > 100 left for the team
    assert s.last_refusal.rule.node == "team"


def test_the_book_survives_a_restart_with_the_holds_of_requests_that_started():
    s = scheduler(QuotaRule("alice", "hour", 1000))
    s.submit("a1", "alice", 100, 500, 0.0)
    s.submit("a2", "alice", 100, 200, 0.0)
    s.assign(0.0)
    s.on_report("w", {"a1": 10}, started={"a1": 100})  # a1 started, a2 not
    saved = json.loads(json.dumps(s.quotas.snapshot(s.started_ids())))
    book = QuotaBook([QuotaRule("alice", "hour", 1000)])
    book.restore(saved)
    assert book.view(["alice"], 1.0)[0]["held_tokens"] == 600  # a2 is submitted again and held then
    book.settle("a1", Amount(150, 0.0), ["alice"], 2.0)
    assert book.view(["alice"], 2.0)[0] | {"resets_in_s": 0} == ALICE_USED_150


requests = st.lists(
    st.tuples(st.sampled_from("ab"), st.integers(1, 300), st.integers(1, 300), st.floats(0, 1), st.floats(0, 200)),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(requests)
def test_no_window_ever_uses_more_than_its_quota(rows):
    """Random requests, sizes, actual outputs and arrival times over several minute windows, with a
    quota per tenant and one over both (a node), a few queued before each assignment: after every
    event, no window's use and holds exceed its maximum, and what every tenant was served in a window
    is within its quota."""
    rules = [QuotaRule("a", "minute", 700), QuotaRule("b", "minute", 500), QuotaRule("org", "minute", 1000)]
    s = FairScheduler(SchedulerConfig(cost=LinearCost(1.0, 2.0)), QuotaBook(rules))
    s.set_node("org", None, 1.0)
    s.add_tenant("a", 1.0, "org")
    s.add_tenant("b", 1.0, "org")
    s.worker_join("w", kv_tokens=100_000)
    served: dict[tuple[str, int], int] = {}
    for i, (tenant, prompt, max_tokens, fraction, at) in enumerate(sorted(rows, key=lambda r: r[4])):
        rid = f"r{i}"
        if s.submit(rid, tenant, prompt, max_tokens, at) is None and i % 3 == 2:  # a few queue up first
            for a in s.assign(at):
                out = max(1, round(a.request.max_tokens * fraction))
                s.on_report("w", {a.request.id: out}, started={a.request.id: a.request.prompt_tokens})
                s.on_finish(a.request.id, out, "stop", at)
                key = (a.request.tenant, int(at // 60))
                served[key] = served.get(key, 0) + a.request.prompt_tokens + out
        s.take_dropped()
        for row in s.quotas.view(None, at):
            assert row["used_tokens"] + row["held_tokens"] <= row["max_tokens"], row
    for (tenant, _), tokens in served.items():
        assert tokens <= {"a": 700, "b": 500}[tenant]
    for window in {w for _, w in served}:
        assert sum(t for (_, w), t in served.items() if w == window) <= 1000


def test_the_configuration_checks_quotas():
    base = {"tenants": [{"name": "alice", "api_key": "a" * 20}], "admin_api_key": "fg-admin-" + "x" * 20}
    config, _ = parse_config({**base, "quotas": [{"node": "alice", "window": "hour", "max_tokens": 5000}]})
    (quota,) = config.quotas
    assert quota.rule() == QuotaRule("alice", "hour", 5000)
    for quotas, needle in (
        ([{"node": "nobody", "window": "hour", "max_tokens": 5}], "no tenant or tree node named 'nobody'"),
        ([{"node": "alice", "window": "week", "max_tokens": 5}], "window"),
        ([{"node": "alice", "window": "hour", "max_tokens": 0}], "max_tokens"),
        ([{"node": "alice", "window": "hour", "max_tokens": 5}] * 2, "two quotas per hour"),
        ([{"node": "alice", "window": "hour"}], "max_tokens, max_cost, a minimum or several"),
        ([{"node": "alice", "window": "hour", "max_tokens": 5, "min_tokens": 6}], "min_tokens must not be above"),
        ([{"node": "alice", "window": "hour", "min_tokens": 5}], "needs a quota with max_tokens on a node above"),
    ):
        with pytest.raises(ValueError, match=needle):
            parse_config({**base, "quotas": quotas})


def test_a_demoting_quota_serves_its_tenant_only_from_what_no_one_within_quota_waits_for():
    """alice's hourly quota demotes: once it is used, her requests wait in the spare band. They run
    when no one else waits, never wait inside an engine (so one that comes later within its quota
    goes first), and are preempted first; her usage goes on counting."""
    s = FairScheduler(
        SchedulerConfig(cost=LinearCost(1.0, 2.0)),
        QuotaBook([QuotaRule("alice", "hour", 300, over="demote")]),
    )
    s.worker_join("w", kv_tokens=10_000, max_running=1)
    assert run(s, "a1", "alice", 100, 200, 200, 0.0) is None  # 300: the quota is used
    assert s.submit("a2", "alice", 100, 100, 1.0) is None  # demoted, not refused
    assert s.submit("b1", "bob", 100, 100, 1.0) is None
    (first,) = s.assign(1.0)
    assert first.request.id == "b1"  # bob, within quota, goes first although alice's came first
    assert s.assign(1.0) == []  # the engine runs one at a time: a2 does not wait inside it
    s.on_report("w", {"b1": 100}, started={"b1": 100})
    s.on_finish("b1", 100, "stop", 2.0)
    (second,) = s.assign(2.0)
    assert second.request.id == "a2" and second.request.priority == 10**9  # preempted first
    s.on_report("w", {"a2": 50}, started={"a2": 100})
    s.on_finish("a2", 50, "stop", 3.0)
    assert s.quotas.view(["alice"], 3.0)[0]["used_tokens"] == 450  # past its quota, counted
    assert s.tenants["alice"].service > 0 and s.tenants["alice~~spare"].service == 100 + 2 * 50


def test_a_request_a_restarted_dispatcher_never_saw_is_held_when_its_worker_announces_it():
    """Assigned after the last save, running when the dispatcher restarted: its worker's hello names it,
    and from then on its quotas hold it as if it had been admitted here, then count what it used."""
    s = scheduler(QuotaRule("alice", "hour", 1000))  # a fresh dispatcher: the book knows nothing of it
    assert s.adopt("w", "early", "alice", 100, 500, 10, now=5.0)
    assert s.quotas.view(["alice"], 5.0)[0]["held_tokens"] == 600
    assert s.submit("a2", "alice", 100, 400, 5.0) == REJECT_QUOTA
    s.on_finish("early", 200, "stop", 6.0)
    row = s.quotas.view(["alice"], 6.0)[0]
    assert (row["used_tokens"], row["held_tokens"]) == (300, 0)


def test_a_demoted_request_still_keeps_to_a_refusing_quota_above_it():
    """alice's own quota demotes, her team's refuses: served from spare capacity, she still cannot take
    the team past its quota."""
    s = FairScheduler(
        SchedulerConfig(cost=LinearCost(1.0, 2.0)),
        QuotaBook([QuotaRule("alice", "hour", 100, over="demote"), QuotaRule("team", "hour", 900)]),
    )
    s.set_node("team", None, 1.0)
    s.add_tenant("alice", 1.0, "team")
    s.add_tenant("bob", 1.0, "team")
    s.worker_join("w", kv_tokens=10_000, max_running=1)
    assert s.submit("a1", "alice", 100, 300, 0.0) is None  # over alice's own: demoted, fits the team's
    assert s.submit("b1", "bob", 100, 500, 0.0) is None
    (first,) = s.assign(0.0)
    assert first.request.id == "b1"  # within quota: first; it holds 600 of the team's 900
    s.on_report("w", {"b1": 500}, started={"b1": 100})
    s.on_finish("b1", 500, "stop", 1.0)
    assert s.assign(1.0) == []  # a1 (400) no longer fits the 300 the team has left: refused now
    assert [(r.id, reason) for r, reason in s.take_dropped()] == [("a1", REJECT_QUOTA)]


def test_each_request_dropped_at_its_turn_answers_with_its_own_quota():
    """Two tenants' second requests no longer fit when their turn comes, in one assignment pass: each
    refusal names its own quota and window (not the last one the pass met)."""
    s = scheduler(QuotaRule("alice", "hour", 1000), QuotaRule("bob", "minute", 500))
    for rid, tenant, size in (("a1", "alice", 500), ("a2", "alice", 500), ("b1", "bob", 250), ("b2", "bob", 250)):
        assert s.submit(rid, tenant, 100, size, 30.0) is None
    s.assign(30.0)
    dropped = {r.id for r, _ in s.take_dropped()}
    assert dropped == {"a2", "b2"}
    assert s.dropped_refusal("a2").rule.node == "alice" and s.dropped_refusal("a2").retry_after_s == HOUR - 30.0
    assert s.dropped_refusal("b2").rule.node == "bob" and s.dropped_refusal("b2").retry_after_s == 30.0
    assert s.dropped_refusal("a1") is None


def team_with_minimums(**config) -> FairScheduler:
    """A team's hourly 1,000 tokens: alice guaranteed 400 of them (at most 700), bob 200 (no maximum
    of his own), carol nothing guaranteed."""
    s = scheduler(
        QuotaRule("team", "hour", 1000),
        QuotaRule("alice", "hour", 700, min_tokens=400),
        QuotaRule("bob", "hour", min_tokens=200),
        **config,
    )
    s.set_node("team", None, 1.0)
    for name in ("alice", "bob", "carol"):
        s.add_tenant(name, 1.0, "team")
    return s


def test_a_guaranteed_minimum_is_kept_from_everyone_else_and_the_rest_is_borrowed():
    s = team_with_minimums()
    assert s.submit("c1", "carol", 200, 201, 0.0) == REJECT_QUOTA  # 401 > 1000 - 400 - 200 kept
    assert "of which 600 tokens kept for other nodes' minimums" in s.last_refusal.left
    assert run(s, "c2", "carol", 200, 200, 200, 0.0) is None  # 400 borrowed: exactly what is not kept
    assert s.submit("c3", "carol", 1, 1, 0.0) == REJECT_QUOTA
    assert run(s, "a1", "alice", 200, 200, 200, 1.0) is None  # alice's own minimum, whatever carol did
    assert run(s, "b1", "bob", 100, 100, 100, 1.0) is None  # bob's
    rows = {row["node"]: row for row in s.quotas.view(None, 2.0)}
    assert rows["team"]["remaining_tokens"] == 0 and rows["bob"]["unused_min_tokens"] == 0
    assert rows["alice"]["unused_min_tokens"] == 0 and rows["alice"]["remaining_tokens"] == 300


def test_a_node_beyond_its_minimum_borrows_only_what_others_do_not_keep():
    s = team_with_minimums()
    assert run(s, "a1", "alice", 200, 300, 300, 0.0) is None  # 500: its 400 and 100 borrowed
    assert s.submit("a2", "alice", 150, 151, 0.0) == REJECT_QUOTA  # 301 > 1000 - 500 - 200 (bob's)
    assert s.submit("a3", "alice", 100, 101, 0.0) == REJECT_QUOTA  # 201 > what alice's own 700 has left
    assert run(s, "a4", "alice", 100, 100, 100, 0.0) is None  # 200: alice at her maximum
    assert s.submit("c1", "carol", 50, 51, 0.0) == REJECT_QUOTA  # 101 > 300 - 200 (bob's)
    assert run(s, "c2", "carol", 50, 50, 50, 0.0) is None
    assert run(s, "b1", "bob", 100, 100, 100, 0.0) is None  # bob's 200, whatever the others did


def test_the_configuration_checks_that_minimums_fit_their_parent_quota():
    base = {
        "tree": [{"name": "team"}],
        "tenants": [{"name": n, "api_key": n * 20, "parent": "team"} for n in ("alice", "bob")],
        "admin_api_key": "fg-admin-" + "x" * 20,
    }
    team = {"node": "team", "window": "hour", "max_tokens": 1000}
    config, _ = parse_config({**base, "quotas": [team, {"node": "alice", "window": "hour", "min_tokens": 600}]})
    assert config.quotas[1].rule().min_tokens == 600
    for quotas, needle in (
        (
            [
                team,
                {"node": "alice", "window": "hour", "min_tokens": 600},
                {"node": "bob", "window": "hour", "min_tokens": 500},
            ],
            r"minimums under 'team' per hour \(1100\) exceed its max_tokens",
        ),
        ([team, {"node": "alice", "window": "day", "min_tokens": 5}], "needs a quota with max_tokens on a node above"),
        ([team, {"node": "alice", "window": "hour", "min_cost": 1.0}], "needs a quota with max_cost"),
    ):
        with pytest.raises(ValueError, match=needle):
            parse_config({**base, "quotas": quotas})


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["alice", "bob", "carol"]),
            st.integers(1, 300),
            st.integers(1, 300),
            st.floats(0, 1),
            st.floats(0, 200),
        ),
        max_size=40,
    )
)
def test_every_unused_minimum_stays_available_to_its_node(rows):
    """Random requests of three tenants under a team's quota, two with minimums: after every event the
    team's window has left at least the minimums its members have not used, and a member asking for
    no more than its unused minimum (and its own maximum) is admitted."""
    s = team_with_minimums()
    s.worker_join("w", kv_tokens=100_000)
    for i, (tenant, prompt, max_tokens, fraction, at) in enumerate(sorted(rows, key=lambda r: r[4])):
        rid = f"r{i}"
        if s.submit(rid, tenant, prompt, max_tokens, at) is None and i % 3 == 2:
            for a in s.assign(at):
                out = max(1, round(a.request.max_tokens * fraction))
                s.on_report("w", {a.request.id: out}, started={a.request.id: a.request.prompt_tokens})
                s.on_finish(a.request.id, out, "stop", at)
        s.take_dropped()
        rows_now = {row["node"]: row for row in s.quotas.view(None, at)}
        team = rows_now["team"]
        unused = {n: rows_now[n]["unused_min_tokens"] for n in ("alice", "bob")}
        assert team["remaining_tokens"] >= sum(unused.values()), (team, unused)
        for name, left in unused.items():
            own = rows_now[name].get("remaining_tokens", left)
            if min(left, own) >= 2:
                probe = f"probe{i}{name}"
                assert s.submit(probe, name, 1, min(left, own) - 1, at) is None, (name, rows_now)
                s.cancel(probe)


def test_a_request_unstarted_at_the_last_save_that_ran_before_the_restart_is_counted_once():
    """Assigned before the save but not started (saved as refunded), then started and ended before the
    dispatcher died: its worker's hello lists it as ended, and the restarted dispatcher counts it in
    the tenant's counter and quota, once."""
    rule = QuotaRule("alice", "hour", 1000)
    s = scheduler(rule)
    s.submit("a1", "alice", 100, 100, 1.0)
    s.assign(1.0)
    saved = json.loads(json.dumps(s.durable_state(saved_at=2.0)))
    book = json.loads(json.dumps(s.quotas.snapshot(s.started_ids())))
    assert saved["unstarted"] == ["a1"] and book["holds"] == {}  # saved as if refunded
    fresh = scheduler(rule)
    fresh.restore_durable(saved, now=3.0)
    fresh.quotas.restore(book)
    assert fresh.settle_ended("w", "a1", "alice", 100, 100, 100, 4.0, assigned_at=1.0)
    assert not fresh.settle_ended("w", "a1", "alice", 100, 100, 100, 5.0, assigned_at=1.0)  # once
    assert fresh.quotas.view(["alice"], 5.0)[0]["used_tokens"] == 200
    assert fresh.tenants["alice"].service == pytest.approx(100 + 2 * 100)


def test_requests_picked_out_of_order_are_held_to_their_quotas_too():
    """The policy's next request (carol's prompt, larger than the free room) waits, and requests behind
    it that fit go first (relaxed head-of-line): alice's second no longer fits her quota at its turn,
    and is refused there as it would be at the head of the line, never held past the quota."""
    config = SchedulerConfig(cost=LinearCost(1.0, 2.0), max_engine_waiting=0)
    s = FairScheduler(config, QuotaBook([QuotaRule("alice", "hour", 1000)]))
    s.worker_join("w", kv_tokens=2_600)
    assert s.submit("c0", "carol", 1_000, 10, 0.0) is None
    assert [a.request.id for a in s.assign(0.0)] == ["c0"]  # 1,599 of the 2,600 left
    assert s.submit("c1", "carol", 1_700, 500, 0.0) is None  # fits nowhere now
    assert s.submit("a1", "alice", 100, 500, 0.0) is None  # each holds 600 of alice's 1,000
    assert s.submit("a2", "alice", 100, 500, 0.0) is None
    s.tenants["carol"].counter, s.tenants["alice"].counter = 0.0, 10.0  # carol's c1 is the policy's next
    assert [a.request.id for a in s.assign(0.0)] == ["a1"]
    assert [(r.id, reason) for r, reason in s.take_dropped()] == [("a2", REJECT_QUOTA)]
    assert s.quotas.view(["alice"], 0.0)[0]["held_tokens"] == 600
