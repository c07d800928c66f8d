"""The core's edge cases that a hostile tenant or an unlucky failure could turn into free service, one
test each (the property suite in ``test_policy_conformance`` finds them too, on random event lists)."""

from __future__ import annotations

import json

import pytest

from fairgate.core import (
    REJECT_RATE_LIMITED,
    REJECT_TENANT_QUEUE_FULL,
    FairScheduler,
    ProfiledCost,
    SchedulerConfig,
    cost_from_spec,
)
from fairgate.core.costs import fit_profiled_cost
from fairgate.loadgen.datasets import COST_PROFILE
from tests.unit.schedulers import make


def test_a_restart_keeps_the_deficit_of_tenants_that_were_waiting():
    s = make()
    s.worker_join("w", kv_tokens=300)
    s.submit("b1", "B", 100, 100, 0.0)
    s.assign(0.0)  # B runs: its counter is 100, the pool is full
    s.submit("a1", "A", 100, 100, 0.0)  # A waits, lifted to... nobody waits: B's counter? B never left
    s.on_report("w", {"b1": 100}, started={"b1": 100})
    s.on_finish("b1", 100, "length", 1.0)  # B: 300, and B was the last to leave the waiting set
    a_before = s.tenants["A"].counter
    assert a_before < s.tenants["B"].counter
    state = json.loads(json.dumps(s.durable_state()))
    restarted = FairScheduler(s.config)
    restarted.restore_durable(state)
    assert restarted.submit("a1", "A", 100, 100, 2.0, resumed=True) is None  # its caller asks again
    assert restarted.tenants["A"].counter == pytest.approx(a_before)  # not lifted to B's 300
    assert restarted.tenants["A"].lifted == pytest.approx(s.tenants["A"].lifted)


def test_a_refund_after_a_live_weight_change_undoes_exactly_the_charge():
    s = make()
    s.worker_join("w", kv_tokens=1000)
    s.submit("a1", "A", 100, 10, 0.0)
    s.assign(0.0)  # charged 100 at weight 1
    s.add_tenant("A", 0.1)
    assert s.requeue("a1")
    assert s.tenants["A"].counter == pytest.approx(0.0)  # not 100 - 100 / 0.1 = -900
    s.assign(1.0)  # charged again, at the new weight
    assert s.tenants["A"].counter == pytest.approx(1000.0)
    s.add_tenant("A", 4.0)
    s.on_finish("a1", 0, "abort", 2.0)  # never started: the dispatch charge goes back
    assert s.tenants["A"].counter == pytest.approx(0.0)


def test_a_prediction_refund_after_a_weight_change_uses_the_weight_of_the_charge():
    s = make("vtc-oracle")
    s.worker_join("w", kv_tokens=1000)
    s.submit("a1", "A", 10, 100, 0.0, true_output=50)
    s.assign(0.0)  # 10 + 2 * 50 charged ahead, at weight 1
    s.add_tenant("A", 0.5)
    s.on_report("w", {"a1": 5}, started={"a1": 10})
    s.on_finish("a1", 5, "stop", 1.0)  # 45 predicted tokens unused: 90 back, divided by 1
    assert s.tenants["A"].counter == pytest.approx(10 + 2 * 5)
    assert s.tenants["A"].counter >= 0


def test_a_request_refused_for_a_full_queue_uses_no_rate_slot():
    s = make("rpm:2", max_queued_per_tenant=1)
    assert s.submit("a1", "A", 10, 10, 0.0) is None
    assert s.submit("a2", "A", 10, 10, 1.0) == REJECT_TENANT_QUEUE_FULL
    s.cancel("a1")
    assert s.submit("a3", "A", 10, 10, 2.0) is None  # the second slot of the minute is still free
    assert s.submit("a4", "A", 10, 10, 3.0) == REJECT_TENANT_QUEUE_FULL
    s.cancel("a3")
    assert s.submit("a5", "A", 10, 10, 4.0) == REJECT_RATE_LIMITED  # two admitted this minute


def test_a_resumed_request_is_not_counted_against_the_rate_again():
    s = make("rpm:1")
    assert s.submit("a1", "A", 10, 10, 0.0) is None
    state = json.loads(json.dumps(s.durable_state()))
    restarted = FairScheduler(s.config)
    restarted.restore_durable(state)
    assert restarted.submit("a1", "A", 10, 10, 1.0, resumed=True) is None  # admitted before the restart
    assert restarted.submit("a2", "A", 10, 10, 2.0) == REJECT_RATE_LIMITED


@pytest.mark.parametrize("policy", ["vtc-predict", "vtc-oracle"])
def test_a_request_lost_with_its_worker_keeps_no_prediction_it_never_consumed(policy):
    s = make(policy)
    s.policy.observe("A", 150)  # vtc-predict learns from what A's requests generated before
    s.worker_join("w", kv_tokens=1000)
    s.submit("a1", "A", 10, 200, 0.0, true_output=150)
    s.assign(0.0)
    s.on_report("w", {"a1": 3}, started={"a1": 10})
    assert s.tenants["A"].counter > 10 + 2 * 3  # the prediction is charged ahead
    assert s.worker_leave("w").lost == ["a1"]
    assert s.tenants["A"].counter == pytest.approx(10 + 2 * 3)  # only what it consumed
    assert s.tenants["A"].counter == pytest.approx(s.tenants["A"].service)


@pytest.mark.parametrize(
    "coeffs",
    [
        (0.2, -0.5, 0.0, 0.1, 1.0),  # b + d < 0: the first output token would be a refund
        (0.2, 0.1, -0.001, 0.0, 1.0),  # c < 0: long prompts make output tokens negative
        (0.2, 0.1, 0.0, -0.001, 1.0),  # d < 0: long outputs turn negative
        (-0.2, 0.1, 0.0, 0.0, 1.0),  # a < 0: long prompts are negative at dispatch
        (0.2, 0.1, 0.0, 0.0, float("nan")),
    ],
)
def test_a_cost_function_with_a_negative_charge_is_refused_when_loaded(coeffs):
    with pytest.raises(ValueError, match="profiled cost"):
        cost_from_spec({"kind": "profiled", "coeffs": list(coeffs)})


def test_a_profile_whose_free_fit_would_charge_negatively_gets_the_closest_valid_h():
    # decode time that falls with the output length: a free fit has d < 0
    profile = {str(x): {str(y): [1, 0.001 * x, 0.5 * y - 0.002 * y * y] for y in (1, 50, 100)} for x in (1, 50, 100)}
    h = fit_profiled_cost(profile)  # accepted by ProfiledCost: every charge non-negative
    assert h.d == 0 and h.total(100, 100) > h.total(100, 99) >= h.total(0, 0) >= 0


def test_the_papers_fit_is_accepted_and_refitting_its_profile_gives_it_again():
    assert ProfiledCost().total(100, 10) > 0
    profile = json.loads(COST_PROFILE.read_text())
    fitted = fit_profiled_cost(profile)
    assert fitted.a == pytest.approx(ProfiledCost().a, rel=1e-4) and fitted.d == pytest.approx(
        ProfiledCost().d, rel=1e-4
    )


def test_a_request_holds_what_it_uses_not_what_it_asks_for():
    s = make()
    s.worker_join("w", kv_tokens=10_000)
    s.submit("a1", "A", 8, 4000, 0.0)  # asks for the whole context: needs its prompt's room to start
    assert s.assign(0.0)[0].request.need == 9
    s.on_report("w", {"a1": 4}, started={"a1": 8}, free_tokens=10_000 - 12)
    assert s.workers["w"].room() == 10_000 - 12  # what the engine says it uses, nothing held beyond
    s.on_finish("a1", 4, "stop", 1.0)
    assert s.submit("huge", "A", 8, 20_000, 2.0) == "too_large"  # too large is judged by the full size
    restored = FairScheduler.from_snapshot(json.loads(json.dumps(s.snapshot())))
    restored.submit("a3", "A", 8, 4000, 3.0)
    assert restored.next_in_line().need == 9


def test_an_old_snapshot_with_reservations_restores():
    s = make()
    s.worker_join("w", kv_tokens=1000)
    s.submit("a", "A", 8, 40, 0.0)
    data = json.loads(json.dumps(s.snapshot()))
    data["config"] |= {"reserve": "predicted", "output_reserve_cap": None}  # settings that are gone
    data["reserve_lengths"] = {"A": [4, 4]}
    for row in data["workers"]:
        del row["watermark"], row["turnover"], row["beyond"]
    restored = FairScheduler.from_snapshot(data)
    assert [a.request.id for a in restored.assign(1.0)] == ["a"]


def test_requests_that_ended_while_a_workers_stream_was_down_are_settled_once():
    s = make()
    s.worker_join("w", kv_tokens=1000)
    for rid in ("lost", "requeued", "known", "done"):
        s.submit(rid, "A", 10, 20, 0.0)
    s.assign(0.0)
    s.on_report("w", {"lost": 5, "done": 20}, started={"lost": 10, "done": 10, "known": 10})
    s.on_finish("done", 20, "length", 1.0)
    served = s.tenants["A"].service
    left = s.worker_leave("w")  # the stream broke: "requeued" had not started, "lost" and "known" had
    assert left.requeued == ["requeued"] and sorted(left.lost) == ["known", "lost"]
    s.worker_join("w", kv_tokens=1000)
    assert s.adopt("w", "known", "A", 10, 20, 7)  # still running: re-announced
    # its hello lists what ended meanwhile, with the final counts
    assert s.settle_ended("w", "lost", "A", 10, 20, 20, 2.0)  # 15 more tokens than the dispatcher saw
    assert s.settle_ended("w", "requeued", "A", 10, 20, 20, 2.0)  # it had started after all
    assert not s.settle_ended("w", "done", "A", 10, 20, 20, 2.0)  # finished before: nothing twice
    assert s.settle_ended("w", "known", "A", 10, 20, 9, 2.0)
    assert not s.settle_ended("w", "known", "A", 10, 20, 9, 3.0)  # a second hello changes nothing
    assert not s.in_flight() and s.queue_depth() == 0 and s.workers["w"].committed == 0
    # what each request consumed, once: "requeued"'s dispatch charge went back at the leave, and came
    # again with its 20 tokens; "lost" 15 tokens more; "known" 9 tokens
    assert s.tenants["A"].service == pytest.approx((served - 10) + 2 * 15 + (10 + 2 * 20) + 2 * 9)


def test_the_admission_settings_of_a_config_are_checked_and_reservations_are_refused_by_name():
    from fairgate.common.sections import ConfigError
    from fairgate.gateway.config import parse_config

    base = {"tenants": [{"name": "a", "api_key": "k" * 16}], "admin_api_key": "admin" * 4}
    config, _ = parse_config({**base, "max_engine_waiting": 0, "overcommit": 3})
    assert (config.scheduler.max_engine_waiting, config.scheduler.overcommit) == (0, 3.0)
    assert SchedulerConfig.from_dict(config.scheduler.to_dict()).overcommit == 3.0  # as a snapshot keeps it
    for bad, says in (
        ({"max_engine_waiting": -1}, "max_engine_waiting"),
        ({"max_engine_waiting": True}, "max_engine_waiting"),
        ({"overcommit": 0.5}, "overcommit"),
        ({"reserve": "predicted"}, "reserve is no longer a setting"),
        ({"output_reserve_cap": 100}, "output_reserve_cap is no longer a setting"),
    ):
        with pytest.raises(ConfigError, match=says):
            parse_config({**base, **bad})
