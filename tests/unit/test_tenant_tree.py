"""The tenant tree and request classes in the core (docs/architecture.md): per-level shares, lifts, moves,
snapshots, durable state, and the changes it refuses."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from fairgate.core import FairScheduler, SchedulerConfig
from fairgate.core.classes import RequestClass
from fairgate.core.tree import TreeError
from fairgate.loadgen.workload import WorkloadError
from fairgate.loadgen.workload_spec import workload_from_spec
from tests.unit.schedulers import make

CLASSES = (RequestClass("interactive", 3.0, ttft_s=2.0), RequestClass("batch", 1.0), RequestClass("ops", strict=True))


def org_tree(s: FairScheduler) -> None:
    """org-a (1) and org-b (3); org-a: team-10 (1) with ten keys, team-1 (1) with one key."""
    s.set_node("org-a", None, 1.0)
    s.set_node("org-b", None, 3.0)
    s.set_node("team-10", "org-a", 1.0)
    s.set_node("team-1", "org-a", 1.0)
    for i in range(10):
        s.add_tenant(f"many{i}", 1.0, "team-10")
    s.add_tenant("single", 1.0, "team-1")
    s.add_tenant("b", 1.0, "org-b")


def serve(s: FairScheduler, tenants: list[str], decisions: int, seed: int = 0, klass: dict | None = None) -> Counter:
    """Keep every tenant backlogged (two requests each); one request runs at a time, 10 prompt
    tokens + 10 output tokens. Returns dispatches per tenant leaf."""
    klass = klass or {}
    rng = random.Random(seed)
    n = 0

    def send(name: str) -> None:
        nonlocal n
        n += 1
        tenant, _, k = name.partition("~")
        assert s.submit(f"r{n}", tenant, 10, 10, float(n), klass=k or klass.get(name, "")) is None

    for name in tenants:
        send(name)
        send(name)
    served: Counter = Counter()
    for i in range(decisions):
        (a,) = s.assign(float(i))
        rid = a.request.id
        s.on_report(a.worker_id, {rid: 10}, started={rid: 10})
        s.on_finish(rid, 10, "stop", float(i))
        served[a.request.tenant] += 1
        send(a.request.tenant)
        if rng.random() < 0.01:  # a rare refund path too: a request put back and served later
            (b,) = s.assign(float(i)) or (None,)
            if b is not None:
                s.requeue(b.request.id)
    return served


def one_slot() -> FairScheduler:
    s = make(max_engine_waiting=0)  # no queue inside the engine: each decision is the dispatcher's
    s.worker_join("w", kv_tokens=25, max_running=1)  # one request at a time
    return s


def test_shares_follow_weights_at_every_level_and_keys_earn_nothing():
    s = one_slot()
    org_tree(s)
    leaves = [f"many{i}" for i in range(10)] + ["single", "b"]
    served = serve(s, leaves, 4000)
    org_a = sum(served[t] for t in leaves if t != "b")
    assert abs(org_a / 4000 - 0.25) < 0.01  # org-a : org-b = 1 : 3
    many = sum(served[f"many{i}"] for i in range(10))
    assert abs(many - served["single"]) <= 2  # ten keys get what one key of the same team weight gets
    assert max(served[f"many{i}"] for i in range(10)) - min(served[f"many{i}"] for i in range(10)) <= 2
    assert s.tree.depth == 3


def test_node_counters_are_their_subtree_weighted_service():
    s = one_slot()
    org_tree(s)
    serve(s, ["many0", "many1", "single", "b"], 500)
    nodes = s.tree.nodes
    for name in ("team-10", "team-1", "org-a", "org-b"):
        node = nodes[name]
        below = sum(t.service for t in s.tenants.values() if node in t.ancestors)
        assert node.service == pytest.approx(below)
        assert node.counter == pytest.approx(node.service / node.weight + node.lifted)


def test_an_idle_organisation_gains_no_credit_when_it_returns():
    s = one_slot()
    org_tree(s)
    serve(s, ["single", "b"], 200)  # org-b and team-1 busy; team-10 idle
    before = s.tree.nodes["team-10"].counter
    s.submit("late", "many3", 10, 10, 1e6)
    team10, team1 = s.tree.nodes["team-10"], s.tree.nodes["team-1"]
    assert team10.counter >= team1.counter - 1e-9  # lifted to its waiting sibling, not left below it
    assert team10.counter > before
    assert s.tenants["many3"].counter >= 0


def test_a_moved_node_keeps_no_credit_and_a_cycle_is_refused():
    s = one_slot()
    org_tree(s)
    serve(s, ["single", "b"], 200)
    s.set_node("fresh", "org-b", 1.0)  # a new team under the busy org-b, counter 0
    s.add_tenant("c", 1.0, "fresh")
    s.submit("c1", "c", 10, 10, 1e6)
    assert s.tree.nodes["fresh"].counter > 0  # lifted on joining: it was never idle credit
    s.set_node("team-1", "org-b")  # move a served team under org-b
    assert s.tree.nodes["team-1"].parent == "org-b"
    assert s.tenants["single"].ancestors == (s.tree.nodes["team-1"], s.tree.nodes["org-b"])
    with pytest.raises(TreeError, match="cycle"):
        s.set_node("org-b", "team-1")
    with pytest.raises(TreeError, match="cycle"):
        s.set_node("org-a", "org-a")
    assert s.tree.nodes["org-b"].parent == ""


def test_bad_changes_are_refused_and_change_nothing():
    s = one_slot()
    org_tree(s)
    snapshot = s.snapshot()
    with pytest.raises(TreeError, match="no tree node 'nowhere'"):
        s.set_node("x", "nowhere")
    with pytest.raises(TreeError, match="no tree node 'nowhere'"):
        s.add_tenant("newkey", 1.0, "nowhere")
    with pytest.raises(TreeError, match="weight must be positive"):
        s.set_node("y", None, 0.0)
    with pytest.raises(TreeError, match="weight must be positive"):
        s.set_node("org-a", None, -1.0)
    with pytest.raises(TreeError, match="is a tenant"):
        s.set_node("single", None, 1.0)
    with pytest.raises(TreeError, match="is a tree node"):
        s.add_tenant("org-a")
    with pytest.raises(TreeError, match="still has"):
        s.delete_node("team-10")
    assert s.snapshot() == snapshot
    s.set_node("empty", "org-a")
    s.delete_node("empty")
    assert "empty" not in s.tree.nodes
    with pytest.raises(ValueError, match="orders by counters"):
        make("fcfs").set_node("org", None, 1.0)


def test_snapshot_with_a_tree_and_classes_restores_the_same_decisions():
    s = make(classes=CLASSES)
    s.worker_join("w", kv_tokens=60)
    org_tree(s)
    rng = random.Random(3)
    names = ["many0", "many5", "single", "b"]
    decisions: list[str] = []

    def step(sched: FairScheduler, i: int, out: list[str], seed: int) -> None:
        r = random.Random(seed)
        for _ in range(r.randrange(3)):
            tenant = r.choice(names)
            sched.submit(
                f"s{seed}-{r.random()}",
                tenant,
                r.randrange(1, 20),
                r.randrange(1, 20),
                float(i),
                klass=r.choice(["", "batch", "interactive", "ops"]),
            )
        for a in sched.assign(float(i)):
            out.append(a.request.id)
        for rid, req in list(sched.in_flight().items()):
            if r.random() < 0.5:
                sched.on_report(req.worker or "", {rid: 3}, started={rid: req.prompt_tokens})
            if r.random() < 0.3:
                sched.on_finish(rid, req.output_tokens, "stop", float(i))

    for i in range(200):
        step(s, i, decisions, rng.randrange(1 << 30))
    twin = FairScheduler.from_snapshot(s.snapshot())
    assert twin.snapshot() == s.snapshot()
    mine: list[str] = []
    theirs: list[str] = []
    for i in range(200, 400):
        seed = rng.randrange(1 << 30)
        step(s, i, mine, seed)
        step(twin, i, theirs, seed)
    assert mine == theirs and mine
    assert "~strict" in {t.parent for t in s.tenants.values()}


def test_durable_state_keeps_node_counters_and_waiting_nodes_are_not_lifted():
    s = one_slot()
    org_tree(s)
    serve(s, ["single", "b", "many1"], 300)
    state = s.durable_state()
    fresh = make()
    fresh.worker_join("w", kv_tokens=25)
    fresh.restore_durable(state)
    for name, node in s.tree.nodes.items():
        restored = fresh.tree.nodes[name]
        assert (restored.parent, restored.weight) == (node.parent, node.weight)
    assert fresh.tenants["many1"].ancestors == (fresh.tree.nodes["team-10"], fresh.tree.nodes["org-a"])
    # the same configuration applied again (as the actor does at start) moves and resets nothing
    org_tree(fresh)
    assert fresh.tree.nodes["org-b"].counter == pytest.approx(s.tree.nodes["org-b"].counter, abs=1e3)
    waiting = set(state["waiting_nodes"])
    assert {"org-a", "org-b"} <= waiting
    counter = fresh.tree.nodes["org-b"].counter
    fresh.submit("again", "b", 10, 10, 0.0, resumed=True)
    assert fresh.tree.nodes["org-b"].counter == counter  # it was waiting when the state was written


def test_batch_class_keeps_its_weight_and_the_strict_band_goes_first():
    s = make(classes=CLASSES, max_engine_waiting=0)
    s.worker_join("w", kv_tokens=25, max_running=1)
    s.add_tenant("key", 2.0)
    s.add_tenant("other", 2.0)
    served = serve(s, ["key", "key~batch", "other"], 2000)
    assert served["key"] + served["key~batch"] == pytest.approx(1000, abs=3)  # the key's weight is its node's
    assert served["key~batch"] / 1000 == pytest.approx(0.25, abs=0.01)  # interactive 3 : batch 1
    assert s.tree.nodes["key"].implicit and s.tenants["key"].weight == 3.0
    s.submit("op", "other", 10, 10, 1e6, klass="ops")
    assert s.next_in_line().id == "op"
    assert s.tenants["other~ops"].ancestors == ()  # charged to no node of the fair tree
    with pytest.raises(ValueError, match="unknown request class"):
        s.submit("bad", "key", 10, 10, 0.0, klass="gold")
    s.add_tenant("key", 5.0)  # reweighting a key with classes reweights its node
    assert s.tree.nodes["key"].weight == 5.0 and s.tenants["key"].weight == 3.0


def test_classes_and_trees_need_a_counter_policy():
    with pytest.raises(ValueError, match="orders by counters"):
        SchedulerConfig(policy="fcfs", classes=CLASSES)
    with pytest.raises(ValueError, match="unique"):
        SchedulerConfig(classes=(RequestClass("a"), RequestClass("a")))
    with pytest.raises(ValueError, match="not be strict"):
        SchedulerConfig(classes=(RequestClass("a", strict=True),))
    config = SchedulerConfig(classes=CLASSES)
    assert SchedulerConfig.from_dict(config.to_dict()) == config


def test_workload_spec_declares_the_tree_and_names_what_is_wrong():
    spec = {
        "duration_s": 60,
        "tree": [{"name": "org", "weight": 2}, {"name": "team", "parent": "org"}],
        "classes": [{"name": "interactive", "weight": 3}, {"name": "batch"}],
        "tenants": [
            {"name": "k", "parent": "team", "rate": 1.0},
            {"name": "k", "parent": "team", "rate": 1.0, "class": "batch"},
        ],
    }
    w = workload_from_spec(spec, seed=1)
    assert w.tree == [("org", "", 2.0), ("team", "org", 1.0)] and w.parents == {"k": "team"}
    assert set(w.tenants) == {"k", "k~batch"}
    bad = {**spec, "tree": [{"name": "team", "parent": "org"}]}
    with pytest.raises(WorkloadError, match="no tree node 'org'"):
        workload_from_spec(bad, seed=1)
    with pytest.raises(WorkloadError, match="weight"):
        workload_from_spec({**spec, "tree": [{"name": "org", "weight": 0}]}, seed=1)
    with pytest.raises(WorkloadError, match="unknown request class 'gold'"):
        workload_from_spec({**spec, "tenants": [{"name": "k", "rate": 1.0, "class": "gold"}]}, seed=1)


def test_the_simulators_report_checks_the_bound_per_sibling_pair_at_every_level():
    from fairgate.loadgen.simulator import SimulationConfig, simulate

    spec = {
        "duration_s": 240,
        "tree": [{"name": "org-a", "weight": 1}, {"name": "org-b", "weight": 3}, {"name": "team", "parent": "org-a"}],
        "classes": [{"name": "interactive", "weight": 3}, {"name": "batch"}],
        "tenants": [
            {"name": "k1", "parent": "team", "rate": 3.0},
            {"name": "k2", "parent": "team", "rate": 3.0},
            {"name": "k3", "parent": "org-a", "rate": 3.0},
            {"name": "k4", "parent": "org-b", "rate": 3.0},
            {"name": "k4", "parent": "org-b", "rate": 3.0, "class": "batch"},
        ],
    }
    workload = workload_from_spec(spec, seed=3)
    vtc = simulate(workload, SimulationConfig(policy="vtc")).report
    assert set(vtc["siblings"]) == {"root", "org-a", "team", "k4"}
    assert vtc["bound_held"] and all(row["held"] for row in vtc["siblings"].values())
    assert vtc["jain_index"] > 0.99  # against the tree's own fair shares
    fcfs = simulate(workload, SimulationConfig(policy="fcfs")).report  # judged against the same tree
    assert not fcfs["siblings"]["root"]["held"] and fcfs["jain_index"] < vtc["jain_index"]


def config_with(**changes):
    raw = {
        "admin_api_key": "fg-admin-" + "x" * 20,
        "tree": [{"name": "org", "weight": 2}, {"name": "team", "parent": "org"}],
        "classes": [{"name": "interactive", "weight": 3, "tier": "default"}, {"name": "batch", "tier": "flex"}],
        "tenants": [
            {"name": "alice", "api_key": "a" * 20, "parent": "team", "classes": ["interactive"]},
            {"name": "bob", "api_key": "b" * 20},
        ],
    }
    return {**raw, **changes}


def test_the_configuration_declares_the_tree_and_classes_and_names_what_is_wrong():
    from fairgate.common.sections import ConfigError
    from fairgate.gateway.config import parse_config

    config, _ = parse_config(config_with())
    assert [n.name for n in config.tree] == ["org", "team"]
    assert config.tenants[0].parent == "team" and config.tenants[0].classes == ("interactive",)
    assert [c.tier_name for c in config.classes] == ["default", "flex"]
    assert [c.name for c in config.scheduler.classes] == ["interactive", "batch"]
    cases = [
        ({"tree": [{"name": "org", "parent": "team"}, {"name": "team", "parent": "org"}]}, "cycle"),
        ({"tree": [{"name": "team", "parent": "nowhere"}]}, "no tree node 'nowhere'"),
        ({"tree": [{"name": "org", "weight": 0}]}, r"tree\[0\].weight must be > 0"),
        ({"tree": [{"name": "alice"}]}, "'alice' is a tree node"),
        ({"classes": [{"name": "batch", "weight": -1}]}, r"classes\[0\].weight must be > 0"),
        ({"classes": [{"name": "a", "tier": "x"}, {"name": "b", "tier": "x"}]}, "its own tier"),
        ({"policy": "fcfs"}, "request classes need a policy that orders by counters"),
        (
            {"policy": "fcfs", "classes": [], "tenants": [{"name": "bob", "api_key": "b" * 20}]},
            "a tenant tree needs a policy that orders by counters, not 'fcfs'",
        ),
    ]
    for change, says in cases:
        with pytest.raises(ConfigError, match=says) as err:
            parse_config(config_with(**change))
        assert "\n" not in str(err.value)
    unknown_parent = config_with()
    unknown_parent["tenants"][1]["parent"] = "nowhere"
    with pytest.raises(ConfigError, match="tenant 'bob': no tree node 'nowhere'"):
        parse_config(unknown_parent)
    unknown_class = config_with()
    unknown_class["tenants"][1]["classes"] = ["gold"]
    with pytest.raises(ConfigError, match=r"tenants\[bob\].classes: no request class 'gold'"):
        parse_config(unknown_class)


def test_the_registry_refuses_bad_changes_with_their_status_and_keeps_the_tree():
    from fairgate.dispatcher.tenant_registry import ServiceClass, TenantError, TenantRegistry

    classes = [ServiceClass(RequestClass("interactive", 3.0), "default"), ServiceClass(RequestClass("batch"), "flex")]
    classes.append(ServiceClass(RequestClass("ops", strict=True), "priority"))
    nodes = [{"name": "org", "parent": "", "weight": 1.0}, {"name": "team", "parent": "org", "weight": 1.0}]
    reg = TenantRegistry([{"name": "k", "key_hash": "h", "parent": "team"}], nodes, classes)
    assert reg.class_for("k", None) == ("", "default") and reg.class_for("k", "flex") == ("batch", "flex")
    assert reg.class_for("k", "batch") == ("batch", "flex")  # by class name too
    for tier in ("priority", "gold"):  # strict classes only when listed; unknown ones never
        with pytest.raises(TenantError, match="not available to this key") as err:
            reg.class_for("k", tier)
        assert err.value.status == 400
    reg.update("k", classes=["ops", "batch"])
    assert reg.class_for("k", "priority") == ("ops", "priority") and reg.class_for("k", "auto") == ("ops", "priority")
    for change, status in (
        (lambda: reg.set_node("org", "team", None, creating=False), 400),  # a cycle
        (lambda: reg.set_node("x", "nowhere", None, creating=True), 400),
        (lambda: reg.set_node("x", None, 0.0, creating=True), 400),
        (lambda: reg.set_node("org", None, None, creating=True), 409),
        (lambda: reg.delete_node("team"), 409),
        (lambda: reg.update("k", parent="nowhere"), 400),
        (lambda: reg.create("org", "h2", 1.0), 400),  # a node's name
    ):
        with pytest.raises(TenantError) as err:
            change()
        assert err.value.status == status
    assert reg.node_records() == nodes and reg.get("k").parent == "team"
    flat = TenantRegistry([{"name": "k", "key_hash": "h"}], [], classes, policy="fcfs")
    with pytest.raises(TenantError, match="needs a policy that orders by counters") as err:
        flat.set_node("org", None, 1.0, creating=True)
    assert err.value.status == 400 and not flat.nodes


def test_moving_a_busy_team_under_an_idle_organisation_lifts_the_organisation():
    s = one_slot()
    org_tree(s)
    s.set_node("org-c", None, 1.0)  # idle since it was made: counter 0
    serve(s, ["single", "b"], 300)
    assert s.tree.nodes["org-c"].counter == 0
    s.set_node("team-1", "org-c")  # team-1 is backlogged: org-c joins the root's waiting set with it
    floor = min(s.tree.nodes[n].counter for n in ("org-a", "org-b") if s.tree.nodes[n].waiting.entries())
    assert s.tree.nodes["org-c"].counter >= floor - 1e-9


def test_a_second_class_is_no_second_queue_cap():
    from fairgate.core import REJECT_TENANT_QUEUE_FULL

    s = make(classes=CLASSES, max_queued_per_tenant=3)
    s.add_tenant("key")
    assert [s.submit(f"r{i}", "key", 10, 10, 0.0, klass=k) for i, k in enumerate(["", "batch", "batch"])] == [None] * 3
    assert s.submit("r3", "key", 10, 10, 0.0, klass="batch") == REJECT_TENANT_QUEUE_FULL
    assert s.submit("r4", "key", 10, 10, 0.0) == REJECT_TENANT_QUEUE_FULL
