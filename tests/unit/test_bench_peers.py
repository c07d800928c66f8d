"""``fairgate bench peers`` without servers: its prompts, workloads, bound, fairgate's configuration,
the peers' command lines, and what the rounds' figures are summed up into."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fairgate.core import LinearCost, engine_queue_slack, two_u
from fairgate.gateway.config import parse_config
from fairgate.loadgen.peers.bench import (
    FAIRGATE,
    FAIRGATE_FCFS,
    FAIRGATE_VTC,
    PeersBenchConfig,
    _summary,
    bound,
    fairgate_arms,
    fairgate_config,
)
from fairgate.loadgen.peers.prompts import prompt_builder
from fairgate.loadgen.peers.report import format_peers, plot_peers
from fairgate.loadgen.peers.routers import PEERS
from fairgate.loadgen.peers.workloads import NAMES, peer_workload
from fairgate.loadgen.workload import TraceRequest, WorkloadError
from fairgate.workers.engines.simulated.tokenizer import count_tokens


def test_prompts_share_text_exactly_where_the_workload_shares_blocks():
    text = prompt_builder(nonce=7, block_tokens=32)
    a = text(TraceRequest("t", 0.0, 100, 1, prefix=(1, 2, 3)))
    b = text(TraceRequest("t", 0.0, 100, 1, prefix=(1, 2, 9)))
    assert count_tokens(a) == count_tokens(b) == 100
    words_a, words_b = a.split(), b.split()
    assert words_a[:64] == words_b[:64]  # blocks 1 and 2
    assert words_a[64:96] != words_b[64:96]  # block 3 against block 9
    assert words_a[96:] != words_b[96:]  # each request's own rest
    other_pass = prompt_builder(nonce=8, block_tokens=32)(TraceRequest("t", 0.0, 100, 1, prefix=(1, 2, 3)))
    assert other_pass.split()[:32] != words_a[:32]  # no pass finds another's cache


def test_prompts_without_prefixes_share_nothing():
    text = prompt_builder(nonce=1, block_tokens=0)
    first, second = (text(TraceRequest("t", 0.0, 48, 1)) for _ in range(2))
    assert count_tokens(first) == count_tokens(second) == 48
    assert first.split()[:16] != second.split()[:16]


@pytest.mark.parametrize("name", NAMES)
def test_every_workload_fits_the_pass_and_scales_with_the_engines(name):
    one = peer_workload(name, engines=1, seconds=30.0)
    two = peer_workload(name, engines=2, seconds=30.0)
    assert one.workload.requests and all(r.arrival_s < 30.0 for r in two.workload.requests)
    assert len(two.workload.requests) > 1.5 * len(one.workload.requests)
    assert max(r.prompt_tokens for r in two.workload.requests) <= 10_000  # fits one simulated pool


def test_skew_sends_one_tenant_through_one_instance_and_splits_the_other():
    skew = peer_workload("skew", engines=2, seconds=20.0)
    assert skew.instances == {"A": (0,), "B": (0, 1)}
    assert skew.gateway_instances == 2
    assert peer_workload("overload", engines=2, seconds=20.0).gateway_instances == 1


def test_mooncake_keeps_its_prefixes_in_blocks_of_the_scaled_size():
    w = peer_workload("mooncake", engines=2, seconds=30.0)
    assert w.block_tokens == w.workload.prefix_block == 32
    assert any(len(r.prefix) > 1 for r in w.workload.requests)
    assert len({r.tenant for r in w.workload.requests}) == 4
    with pytest.raises(WorkloadError, match="unknown workload"):
        peer_workload("nope", engines=2, seconds=30.0)


def test_the_bound_is_fairgates_for_the_pool_and_the_workload():
    config = PeersBenchConfig(engines=2)
    w = peer_workload("overload", engines=2, seconds=30.0)
    expected = two_u(LinearCost(), 256, 256, 2 * 10_000 * 2) + engine_queue_slack(LinearCost(), 256, 2 * 8)
    assert bound(config, w) == expected


@pytest.mark.parametrize("name", ["overload", "mooncake", "skew"])
@pytest.mark.parametrize("controls", [False, True])
def test_fairgates_configuration_is_one_it_accepts(name, controls):
    w = peer_workload(name, engines=2, seconds=30.0)
    keys = {t: f"fg-bench-key-{i:04d}-abcdefghijkl" for i, t in enumerate(w.workload.tenants)}
    arms = fairgate_arms(w, controls)
    expected = [FAIRGATE, FAIRGATE_VTC] if name == "mooncake" else [FAIRGATE]
    assert list(arms) == expected + ([FAIRGATE_FCFS] if controls else [])
    policies = {}
    for arm, (policy, placement) in arms.items():
        config, _ = parse_config(fairgate_config(PeersBenchConfig(), w, keys, policy, placement))
        assert config.workers.count == 2
        assert config.ingress.replicas == w.gateway_instances
        assert arm.startswith(FAIRGATE)  # the verdict tells fairgate's arms from the peers' by name
        policies[arm] = (config.scheduler.policy, config.scheduler.placement)
    cache_aware = name == "mooncake"
    assert policies[FAIRGATE][0].startswith("vtc-locality") == cache_aware
    assert (policies[FAIRGATE][1] == "prefix-affinity") == cache_aware
    if controls:
        assert policies[FAIRGATE_FCFS] == ("fcfs", "most-room")


def test_the_peers_listen_on_loopback_and_name_every_engine(tmp_path: Path):
    backends = ["http://127.0.0.1:1001", "http://127.0.0.1:1002"]
    for name in ("sglang-router", "vllm-router"):
        args = PEERS[name].arguments(backends, 4000, tmp_path, "m", "k")
        assert args[args.index("--host") + 1] == "127.0.0.1"
        assert args[args.index("--prometheus-host") + 1] == "127.0.0.1"
        assert args[-2:] == backends
    args = PEERS["ray-serve-llm"].arguments(backends, 4000, tmp_path, "m", "k")
    assert args == ["--port", "4000", "--backends", *backends]
    args = PEERS["litellm"].arguments(backends, 4000, tmp_path, "m", "sk-key")
    config = yaml.safe_load(Path(args[args.index("--config") + 1]).read_text())
    assert [d["litellm_params"]["api_base"] for d in config["model_list"]] == [b + "/v1" for b in backends]
    assert {d["model_name"] for d in config["model_list"]} == {"m"}
    assert config["general_settings"]["master_key"] == "sk-key"
    assert args[args.index("--host") + 1] == "127.0.0.1"


def _pass(tokens: float, gap: float, light: float | None, p50: float, hits: float | None = None) -> dict:
    tenants = {"A": {"p50_ttft_s": p50, "p99_ttft_s": 2 * p50, "service": 1.0}}
    return {
        "throughput_tokens_per_s": tokens,
        "output_tokens_per_s": tokens / 2,
        "requests_finished": 10,
        "gap": gap,
        "gap_vs_bound": gap / 100.0,
        "jain": 0.9,
        "prefix_hit_rate": hits,
        "errors": 0,
        "light_ttft_ms": light,
        "tenants": tenants,
    }


def test_the_summary_takes_medians_of_rounds_and_compares_with_the_best_peer(tmp_path: Path):
    passes = {
        FAIRGATE: [_pass(1000, 10, 32.0, 1.0, 0.5), _pass(900, 20, 33.0, 3.0, 0.25), _pass(950, 150, 31.0, 2.0)],
        "fast": [_pass(1100, 40, 40.0, 1.0), _pass(1000, 60, 42.0, 1.0), _pass(1050, 50, None, 1.0)],
    }
    w = peer_workload("overload", engines=1, seconds=5.0)
    s = _summary(w, 100.0, passes, [30.0, 30.0, 30.0])
    ours, fast = s["arms"][FAIRGATE], s["arms"]["fast"]
    assert ours["throughput_tokens_per_s"] == 950 and ours["gap"] == 20
    assert ours["tenants"]["A"]["p50_ttft_s"] == 2.0
    assert not ours["bound_held_every_round"]  # one round's gap (150) passed the bound (100)
    assert ours["light_ttft_added_ms"] == 2.0 and fast["light_ttft_added_ms"] == 11.0  # a failed pass left out
    v = s["verdict"]
    assert v["throughput_vs_best_peer"] == pytest.approx(950 / 1050)
    assert v["output_vs_best_peer"] == pytest.approx(475 / 525)
    assert v["light_ttft_added_vs_fastest_peer_ms"] == pytest.approx(-9.0)
    assert v["faster_peers"] == ["fast"] and v["fairer_peers"] == []
    out = {
        "config": {"engine": "simulated", "engines": 1, "settings": {}, "seconds": 5.0, "rounds": 3},
        "workloads": {"overload": s},
    }
    table = format_peers(out)
    assert "| fairgate | 950 | 475 | 38% | 20 (0.200) | 0.900 | 2.00 / 4.00 | +2.0 | 0 |" in table
    assert "| fast | 1,050 | 525 | - | 50 (0.500) |" in table  # no hit reported: none shown
    assert "with more throughput: fast" in table
    assert plot_peers(tmp_path / "p.png", "overload", s).stat().st_size > 0
