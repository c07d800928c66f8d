"""A worker node lost whole under a two-tenant flood, on a real multi-node Ray cluster started with
``ray start`` on this machine (``tests/e2e/node_loss.py`` is the driver; its own cluster, apart from
the session's). Only requests already streaming from the lost node fail, each with a clear error; the
rest are placed again; the node's replica comes back when the node does; the counters stay exact;
the fair shares hold after recovery."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.stream_clients import MAX_TOKENS

pytestmark = pytest.mark.slow


def test_a_worker_node_lost_whole_fails_only_what_streamed_there_and_the_pool_recovers():
    run = subprocess.run(
        [sys.executable, "-m", "tests.e2e.node_loss"],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},  # its own cluster, not the session's
    )
    assert run.returncode == 0, run.stderr[-4000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    out = figures["outcomes"]
    failed, completed = out["failed"], out["completed"]
    received = {t: sum(c["tokens"] for c in completed if c["tenant"] == t) for t in figures["end"]["tenants"]}
    reasons: dict[str, int] = {}
    for x in failed:
        reasons[x["reason"][:60]] = reasons.get(x["reason"][:60], 0) + 1
    f = figures
    print(
        f"node killed ({f['processes_killed']} processes) with {f['running_on_victim']} requests on it; "
        f"worker lost after {f['worker_lost_after_s']:.1f} s, back {f['replica_back_after_s']:.1f} s after the kill; "
        f"completed {len(completed)}, failed {len(failed)} by reason {reasons}; shares after recovery "
        f"{f['shares_after_recovery']}, gap {f['gap_after_recovery']:.0f} (2U {f['bound_2u']:.0f})"
    )
    assert figures["driver_on_head"]  # the lost node held no part of the test itself
    # every request completes whole, or (only those already streaming from the lost node) fails
    # saying its worker failed
    assert all(c["tokens"] == MAX_TOKENS for c in completed)
    assert all(x["streamed"] and "worker" in x["reason"] for x in failed), failed
    assert len(failed) <= figures["running_on_victim"]
    # the replica came back with its node; nothing is left queued, assigned or orphaned
    end = figures["end"]
    assert end["workers"] == 2
    assert end["queue_depth"] == end["in_flight"] == end["pending_submits"] == end["orphans"] == 0
    # counters exact: each tenant charged every token its clients received, and at most the partial
    # outputs of its failed streams beyond that (never a request twice)
    for tenant, row in end["tenants"].items():
        lost = sum(1 for x in failed if x["tenant"] == tenant)
        assert received[tenant] <= row["output_tokens"] <= received[tenant] + lost * MAX_TOKENS, (tenant, row, lost)
        assert row["counter"] == pytest.approx(row["service"] + row["lifted"])  # weight 1: VTC's own identity
    # the fair shares hold after recovery
    shares = figures["shares_after_recovery"]
    assert min(shares.values()) >= 0.4 * sum(shares.values()), shares
    assert figures["gap_after_recovery"] <= figures["bound_2u"]
