"""One way for every plug-in to take parameters (``fairgate.core.registry``): specs as text or as a
mapping, checked against the class's stated parameters, and written back as the text that builds the
same plug-in; the benches' flags come from the same parameters."""

from __future__ import annotations

import pytest

from fairgate.cli import bench as bench_cli
from fairgate.cli.parsing import Parser
from fairgate.cli.plugins import layout_markdown, plugin_rows
from fairgate.core import make_placement, make_policy, placement_names
from fairgate.core.policies import policy_examples
from fairgate.core.registry import parse_spec
from fairgate.gateway.config import parse_config
from fairgate.loadgen.benches import bench_for, bench_names


def test_a_spec_is_text_or_a_mapping():
    assert parse_spec("vtc") == ("vtc", {})
    assert parse_spec(" RPM:5 ") == ("rpm", {"": "5"})
    assert parse_spec("vtc-locality:slack=500") == ("vtc-locality", {"slack": "500"})
    assert parse_spec({"name": "vtc-locality", "slack": 500}) == ("vtc-locality", {"slack": 500})
    with pytest.raises(ValueError, match="needs a name"):
        parse_spec({"slack": 500})
    with pytest.raises(ValueError, match="key=value"):
        parse_spec("vtc-locality:slack=1,2")


def test_every_form_builds_the_same_plugin_and_its_spec_builds_it_again():
    text, mapping = make_policy("vtc-locality:500"), make_policy({"name": "vtc-locality", "slack": 500})
    keyed = make_policy("vtc-locality:slack=500")
    assert text.spec == mapping.spec == keyed.spec == "vtc-locality:500"
    assert text.locality_slack == 500.0
    assert make_policy("vtc-locality").spec == "vtc-locality"  # defaults are not written
    for spec in policy_examples():
        assert make_policy(make_policy(spec).spec).spec == make_policy(spec).spec
    for name in placement_names():
        rule = make_placement(name)
        assert make_placement(rule.spec).spec == rule.spec
    assert make_placement({"name": "prefix-affinity", "balance": 0.5}).spec == "prefix-affinity:0.5"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("nope", "unknown policy 'nope'"),
        ("vtc:5", "takes no parameter"),
        ("rpm", "needs limit"),
        ("rpm:2.5", "limit must be a whole number"),
        ("rpm:0", "at least 1"),
        ("vtc-locality:slak=3", "unknown parameter 'slak' .it takes: slack."),
        ({"name": "vtc-locality", "slack": "far"}, "slack must be a number"),
        ({"name": "vtc-locality", "slack": True}, "slack must be a number"),
    ],
)
def test_a_bad_spec_names_what_is_wrong(spec, says):
    with pytest.raises(ValueError, match=says):
        make_policy(spec)


def test_the_configuration_takes_a_plugin_as_text_or_as_a_mapping():
    base = {"tenants": [{"name": "a", "api_key": "k" * 16}], "admin_api_key": "admin" * 4}
    as_text, _ = parse_config({**base, "policy": "vtc-locality:500", "placement": "prefix-affinity:0.5"})
    as_mapping, _ = parse_config(
        {
            **base,
            "policy": {"name": "vtc-locality", "slack": 500},
            "placement": {"name": "prefix-affinity", "balance": 0.5},
        }
    )
    assert as_text.scheduler == as_mapping.scheduler
    assert (as_text.scheduler.policy, as_text.scheduler.placement) == ("vtc-locality:500", "prefix-affinity:0.5")
    with pytest.raises(ValueError, match="unknown parameter 'slak'"):
        parse_config({**base, "policy": {"name": "vtc-locality", "slak": 5}})


def test_every_bench_takes_its_parameters_as_flags_and_a_json_path():
    parser = Parser(prog="fairgate")
    bench_cli.add_parser(parser.add_subparsers(dest="command"))
    for name in bench_names():
        plugin = bench_for(name)
        args = parser.parse_args(["bench", name, "--json", "/tmp/x.json"])
        assert args.target == name
        options = bench_cli.bench_parser(name, plugin).parse_args(args.options)
        assert options.json == "/tmp/x.json"
        for p in plugin.params:
            assert getattr(options, p.name) == (False if p.kind is bool else p.default), (name, p.name)
    args = parser.parse_args(["bench", "revoke", "--max-running", "8", "--seeds", "3"])
    options = bench_cli.bench_parser("revoke", bench_for("revoke")).parse_args(args.options)
    assert (options.max_running, options.seeds) == (8, "3")


def test_the_plugin_table_lists_every_registered_plugin():
    table = layout_markdown()
    rows = plugin_rows()
    assert {kind for kind, _, _ in rows} == {"policy", "placement", "engine", "bench"}
    assert len(table.splitlines()) == 2 + len(rows)
    assert "`rpm:LIMIT`" in table and "`fairgate bench peers`" in table and "`workers/engines/vllm/`" in table
