"""``fairgate.loadgen.pausing``: a server's whole process tree stops and continues, and a server is found by its
port; real processes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from fairgate.loadgen.pausing import listening_process, paused, process_tree

# a parent that starts a child, both sleeping; prints the child's pid
PARENT = (
    "import subprocess, sys, time;"
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
    "print(c.pid, flush=True); time.sleep(60)"
)
# listens on a free port of 127.0.0.1; prints it
LISTENER = (
    "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
    "print(s.getsockname()[1], flush=True); time.sleep(60)"
)


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def _until(check, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail("the processes never reached the expected state")
        time.sleep(0.05)


@pytest.fixture
def parent():
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    yield proc.pid, child
    proc.kill()
    proc.wait()
    subprocess.run(["kill", "-9", str(child)], check=False)


def test_the_tree_holds_a_process_and_its_children_parents_first(parent):
    pid, child = parent
    tree = process_tree(pid)
    assert tree[0] == pid and child in tree
    assert pid not in process_tree(child)


def test_a_paused_tree_is_stopped_and_continues_when_the_block_ends(parent):
    pid, child = parent
    with paused(pid) as stopped:
        assert set(stopped) == {pid, child}
        _until(lambda: _state(pid) == "T" and _state(child) == "T")
    _until(lambda: _state(pid) != "T" and _state(child) != "T")


def test_a_tree_continues_even_when_the_block_fails(parent):
    pid, child = parent
    with pytest.raises(RuntimeError), paused(pid):
        _until(lambda: _state(child) == "T")
        raise RuntimeError("the measurement failed")
    _until(lambda: _state(pid) != "T" and _state(child) != "T")


def test_the_listening_process_is_found_by_its_port():
    proc = subprocess.Popen([sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        assert listening_process(port) == proc.pid
    finally:
        proc.kill()
        proc.wait()
    assert listening_process(port) is None
