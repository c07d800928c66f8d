"""What dispatcher shards exchange (``fairgate.core.shards``): the fleet's figures after a round add up
every shard's charges once and its lifts once; each shard adopts them with its own changes since it
sent on top; a tenant's waiting requests are dealt by capacity, with as few moves as that takes."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from fairgate.core import FairScheduler, SchedulerConfig
from fairgate.core.shards import FleetFigures, ShardSender, ShardView, combine, deal, sharded_bound


def test_charges_add_up_and_a_lift_counts_once():
    base = {"t/a": (100.0, 50.0, 10.0)}
    changes = [
        {"t/a": (30.0, 45.0, 30.0)},  # charged 15, lifted 30
        {"t/a": (20.0, 50.0, 30.0), "t/b": (5.0, 5.0, 0.0)},  # charged 20, lifted to the same floor
    ]
    fleet = combine(base, changes)
    assert fleet["t/a"] == (150.0, 50.0 + 15.0 + 20.0 + 30.0, 40.0)
    assert fleet["t/b"] == (5.0, 5.0, 0.0)


def test_a_tenant_s_waiting_requests_are_dealt_by_capacity_with_the_fewest_moves():
    assert deal([8, 0], [1, 1]) == [(0, 1, 4)]
    assert deal([5, 3], [1, 1]) == []  # each holds more than half its share: no redirect is worth it
    assert deal([1, 0, 0, 0], [1, 1, 1, 1]) == []  # what does not divide stays
    assert deal([0, 9, 3], [1, 2, 3]) == [(1, 0, 2)]  # the third holds half its share of 6: left as it is


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=8), st.lists(st.integers(1, 4), min_size=8, max_size=8))
def test_dealing_moves_only_what_a_shard_holds_and_leaves_none_below_half_its_share(counts, capacities):
    shares = capacities[: len(counts)]
    moves = deal(counts, shares)
    after = list(counts)
    for src, dst, n in moves:
        assert n > 0 and src != dst
        after[src] -= n
        after[dst] += n
    assert sum(after) == sum(counts) and min(after) >= 0
    total, weight = sum(counts), sum(shares)
    for i, have in enumerate(after):
        assert 2 * have >= int(total * shares[i] / weight) or all(
            after[j] <= int(total * shares[j] / weight) + 1 for j in range(len(after))
        )


def _shard(tenants: list[str]) -> FairScheduler:
    s = FairScheduler(SchedulerConfig())
    s.worker_join("w", kv_tokens=100_000)
    for t in tenants:
        s.add_tenant(t)
    return s


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from("ab"), st.integers(1, 30)), max_size=40))
def test_after_each_round_every_shard_sees_every_charge_of_the_fleet_once(charges):
    """Three shards serve requests; a round after every few: each shard's view of each tenant is then
    the sum over shards of what each served, its counter that service and the round's lifts, and
    every shard's view the same."""
    shards = [_shard(["a", "b"]) for _ in range(3)]
    views = [ShardView(s) for s in shards]
    fleet: dict = {}
    served = {"a": 0.0, "b": 0.0}
    for i, (k, tenant, tokens) in enumerate(charges):
        s = shards[k]
        s.submit(f"r{i}", tenant, 10, tokens, float(i))
        (a,) = s.assign(float(i))
        s.on_report("w", {a.request.id: tokens}, started={a.request.id: 10})
        s.on_finish(a.request.id, tokens, "length", float(i))
        served[tenant] += s.ledger.cost_between(None, (10, tokens))
        if i % 3 == 2:
            fleet = combine(fleet, [v.changes() for v in views])
            for v in views:
                v.adopt(fleet, ())
            for name in "ab":
                for s in shards:
                    t = shards[0].tenants[name]
                    assert abs(s.tenants[name].service - served[name]) < 1e-6
                    assert abs(t.counter - t.lifted - served[name]) < 1e-6
                    assert (s.tenants[name].counter, s.tenants[name].lifted) == (t.counter, t.lifted)


def test_a_tenant_waiting_on_another_shard_is_not_lifted_when_it_joins_this_one():
    s = _shard(["a", "b"])
    s.submit("b1", "b", 10, 10, 0.0)
    s.tenants["b"].counter = 500.0  # b waits here, served 500; a was served less
    s.adopt_figures({}, {"a"})
    s.submit("a1", "a", 10, 10, 0.0)
    assert s.tenants["a"].counter == 0.0  # it waited all along elsewhere: its place is kept
    s.cancel("a1")
    s.adopt_figures({}, ())
    s.submit("a2", "a", 10, 10, 0.0)
    assert s.tenants["a"].counter == 500.0  # back from idle: lifted to the least-served waiting one


def test_the_sharded_bound_adds_twice_one_round_of_the_fleet_s_service():
    assert sharded_bound(1000.0, 50.0, 1) == 1000.0
    assert sharded_bound(1000.0, 50.0, 4) == 1100.0


def test_the_threshold_rule_takes_back_the_newest_running_requests_beyond_the_share_of_the_one_ahead():
    """A ran 6 requests to B's 2 and is more than the threshold ahead while B waits: A's share of the 8
    running is 4, so its 2 newest are taken back; one round is out at a time."""
    s = FairScheduler(SchedulerConfig(threshold=1000.0, revoke=False, max_engine_waiting=0))
    s.worker_join("w", kv_tokens=100_000, max_running=8)
    for t in ("a", "b"):
        s.add_tenant(t)
    placed = []
    for i in range(6):
        s.submit(f"a{i}", "a", 100, 100, float(i))
        placed += s.assign(float(i))
    for i in range(2):
        s.submit(f"b{i}", "b", 100, 100, 10.0)
        placed += s.assign(10.0)
    s.on_report("w", {a.request.id: 1 for a in placed}, started={a.request.id: 100 for a in placed}, running=8)
    s.submit("b-waits", "b", 100, 100, 11.0)
    assert s.assign(11.0) == []  # the batch is full: b waits
    assert s.preemptions() == []  # a is not yet more than the threshold ahead
    s.on_report("w", {f"a{i}": 100 for i in range(6)}, running=8)
    assert s.tenants["a"].counter - s.tenants["b"].counter > 1000
    assert sorted(s.preemptions()) == [("a4", "w"), ("a5", "w")]
    assert s.preemptions() == []  # its round is out
    s.on_finish("a5", 101, "abort", 12.0)
    s.preemption_answered("a5")
    assert s.preemptions() == []
    s.on_finish("a4", 101, "abort", 12.0)
    s.preemption_answered("a4")
    s.on_report("w", {}, running=6)
    assert [a.request.id for a in s.assign(12.0)] == ["b-waits"]


class _Figures:
    """A shard's figures alone (the FigureSource a scheduler is): charges add to service and counter."""

    def __init__(self) -> None:
        self.figures: dict[str, tuple[float, float, float]] = {}

    def charge(self, key: str, amount: float) -> None:
        s, c, lifted = self.figures.get(key, (0.0, 0.0, 0.0))
        self.figures[key] = (s + amount, c + amount, lifted)

    def member_figures(self):
        return dict(self.figures)

    def adopt_figures(self, figures, waiting_elsewhere) -> None:
        self.figures.update(figures)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["charge", "send", "adopt"]), st.integers(0, 2), st.sampled_from(["t/a", "t/b"])),
        max_size=60,
    )
)
def test_sends_and_adopts_in_any_order_lose_no_charge_and_count_none_twice(ops):
    """Shards send their changes to the fleet's figures and adopt them whenever they like, several
    adopts between two sends included (the fleet's figures arriving in parts): once every shard has
    sent and adopted, each sees every charge of every shard exactly once."""
    sources = [_Figures() for _ in range(3)]
    views = [ShardView(s) for s in sources]
    fleet: dict = {}
    total = {"t/a": 0.0, "t/b": 0.0}
    for i, (op, k, key) in enumerate(ops):
        if op == "charge":
            sources[k].charge(key, float(i + 1))
            total[key] += i + 1
        elif op == "send":
            fleet = combine(fleet, [views[k].changes()])
        else:
            views[k].adopt(fleet, ())
    for view in views:
        fleet = combine(fleet, [view.changes()])
    for view, source in zip(views, sources, strict=True):
        view.adopt(fleet, ())
        for key, amount in total.items():
            assert source.figures.get(key, (0.0, 0.0, 0.0))[:2] == (amount, amount)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["charge", "round"]), st.integers(0, 2), st.booleans(), st.booleans()),
        max_size=50,
    )
)
def test_rounds_whose_answers_or_replies_are_lost_count_every_charge_once(ops):
    """A round may lose a shard's answer (its batches go in a later round) or the fleet's reply to it
    (it sends those batches again; they are combined once): once rounds go through, every shard sees
    every charge exactly once."""
    from fairgate.core.shards import FleetFigures, ShardSender

    sources = [_Figures() for _ in range(3)]
    senders = [ShardSender(s) for s in sources]
    fleet = FleetFigures()
    total = 0.0
    for i, (op, k, answer_lost, reply_lost) in enumerate(ops):
        if op == "charge":
            sources[k].charge("t/a", float(i + 1))
            total += i + 1
            continue
        sent = {str(j): s.batches() for j, s in enumerate(senders) if not (j == k and answer_lost)}
        fleet.round(sent)
        for j, sender in enumerate(senders):
            if str(j) in sent and not (j == k and reply_lost):
                sender.adopt(fleet.figures, (), fleet.combined.get(str(j), 0))
    for _ in range(2):  # rounds that go through
        fleet.round({str(j): s.batches() for j, s in enumerate(senders)})
        for j, sender in enumerate(senders):
            sender.adopt(fleet.figures, (), fleet.combined.get(str(j), 0))
    for source in sources:
        assert source.figures.get("t/a", (0.0, 0.0, 0.0))[:2] == (total, total)


def test_a_restarted_shard_s_batches_after_its_durable_state_are_taken_back_and_numbered_on():
    fleet = FleetFigures()
    fleet.round({"0": [(1, {"t/a": (10.0, 10.0, 0.0)})], "1": [(1, {"t/a": (5.0, 5.0, 0.0)})]})
    fleet.durable("1", 1)  # shard 1 saved a state holding its batch 1
    fleet.round({"1": [(2, {"t/a": (7.0, 7.0, 0.0)})]})
    fleet.round({"1": [(3, {"t/a": (4.0, 9.0, 5.0)})]})  # charged 4, lifted 5
    assert fleet.figures["t/a"] == (26.0, 31.0, 5.0)
    fleet.restart("1", 1)  # it restarted from that state: batches 2 and 3 are reported to it again
    assert fleet.figures["t/a"] == (15.0, 20.0, 5.0)  # the lift stays, the charges go
    assert fleet.combined["1"] == 1
    fleet.round({"1": [(2, {"t/a": (11.0, 11.0, 0.0)})]})  # the same work, charged again by the restarted shard
    assert fleet.figures["t/a"] == (26.0, 31.0, 5.0)


def test_a_restarted_shard_s_batches_not_combined_yet_are_combined_later():
    fleet = FleetFigures()
    fleet.round({"0": [(1, {"t/a": (3.0, 3.0, 0.0)})]})
    fleet.restart("0", 4)  # its durable state holds batches 2-4, never combined (its answers were lost)
    assert fleet.combined["0"] == 1
    fleet.round({"0": [(2, {"t/a": (1.0, 1.0, 0.0)}), (5, {"t/a": (2.0, 2.0, 0.0)})]})
    assert fleet.figures["t/a"] == (6.0, 6.0, 0.0)


def test_a_shard_s_rounds_state_saved_with_its_durable_state_goes_on_after_a_restart():
    shard = _shard(["a"])
    sender = ShardSender(shard)
    shard.submit("r1", "a", 10, 5, 0.0)
    shard.assign(0.0)
    shard.on_report("w", {"r1": 5}, started={"r1": 10})
    shard.on_finish("r1", 5, "length", 0.0)  # ended: nothing of it is reported again after a restart
    first = sender.batches()
    sender.adopt({"t/a": (0.0, 10.0, 0.0)}, (), combined=0)  # batch 1 not combined yet
    shard.submit("r2", "a", 20, 5, 0.0)  # a change not sent yet
    shard.assign(0.0)
    shard.on_report("w", {"r2": 5}, started={"r2": 20})
    shard.on_finish("r2", 5, "length", 0.0)
    saved = json.loads(json.dumps({"durable": shard.durable_state(), "rounds": sender.state()}))
    restored = FairScheduler(shard.config)
    restored.restore_durable(saved["durable"])
    again = ShardSender.restored(restored, saved["rounds"])
    batches = again.batches()
    assert batches == sender.batches()  # it goes on as the lost shard would have
    assert again.seq == 2
    assert batches[0] == first[0]  # kept until combined
    assert ShardSender.restored(restored, None).batches() == []  # none saved: the restored figures are the fleet's
