"""The benchmark's CPU split: the engine's compute processes on their cores, everything else on the rest."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from fairgate.loadgen.cpu_split import MACHINE_CPUS, busy_share, cpu_times, parse_cpus, split_cpus


def test_cpu_lists_parse_and_must_leave_the_host_some():
    last = max(MACHINE_CPUS)
    if len(MACHINE_CPUS) > 1:
        assert parse_cpus(str(last)) == {last}
    with pytest.raises(ValueError, match="some, not all"):
        parse_cpus(",".join(str(c) for c in MACHINE_CPUS))
    with pytest.raises(ValueError, match="some, not all"):
        parse_cpus(str(last + 64))


@pytest.mark.skipif(len(MACHINE_CPUS) < 2, reason="a split needs two cores")
def test_compute_processes_go_to_the_engine_cores_and_every_other_to_the_rest():
    engine = {max(MACHINE_CPUS)}
    compute = subprocess.Popen(["bash", "-c", "exec -a VLLM::Worker sleep 30"])
    other = subprocess.Popen(["sleep", "30"])
    mine = os.sched_getaffinity(0)
    try:
        for _ in range(100):  # until bash has exec'd under its new title
            with open(f"/proc/{compute.pid}/cmdline", "rb") as f:
                if f.read().startswith(b"VLLM::Worker"):
                    break
            time.sleep(0.01)
        counts = split_cpus([compute.pid, other.pid], ("VLLM::EngineCore", "VLLM::Worker"), engine)
        assert counts == (1, 2)  # this process is on the host's side too
        assert os.sched_getaffinity(compute.pid) == engine
        assert os.sched_getaffinity(other.pid) == set(MACHINE_CPUS) - engine
        assert os.sched_getaffinity(0) == set(MACHINE_CPUS) - engine
    finally:
        os.sched_setaffinity(0, mine)
        for p in (compute, other):
            p.kill()
            p.wait()


def test_busy_shares_come_from_the_kernels_counts():
    before = {0: (100, 1000), 1: (500, 1000)}
    after = {0: (150, 1100), 1: (600, 1100)}  # CPU 0 half busy, CPU 1 wholly busy since
    assert busy_share(before, after, {0}) == 0.5 and busy_share(before, after, {1}) == 1.0
    assert busy_share(before, after, {0, 1}) == 0.75 and busy_share(before, after, set()) == 0.0
    now = cpu_times()
    assert set(MACHINE_CPUS) <= set(now) and all(0 <= busy <= total for busy, total in now.values())
