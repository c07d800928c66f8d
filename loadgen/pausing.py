"""Pausing a server with every process under it (SIGSTOP, then SIGCONT), so that two servers can stay
up side by side while only one of them runs: ``fairgate bench openai`` measures each arm alone on
the machine, a few seconds from the other, without restarting either.

A server's processes are found from the process table (``/proc``), not from a process group: Ray
starts its workers under its raylet, outside the group of the command that started the cluster.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"  # a TCP socket's state in /proc/net/tcp


def process_tree(root: int) -> list[int]:
    """``root`` and every process under it, parents before their children."""
    children: dict[int, list[int]] = {}
    for stat in PROC.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # the command name (field 2) may hold spaces and parentheses: the parent is after the last ')'
            fields = stat.read_text().rpartition(")")[2].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, i = [root], 0
    while i < len(tree):
        tree.extend(children.get(tree[i], ()))
        i += 1
    return tree


def listening_process(port: int) -> int | None:
    """The process that listens on TCP ``port`` (of the first one found when several share it)."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for row in (PROC / "net" / table).read_text().splitlines()[1:]:
                cols = row.split()
                if cols[3] == LISTEN and int(cols[1].rpartition(":")[2], 16) == port:
                    inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return None
    for fd_dir in PROC.glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(fd_dir.parent.name)
    return None


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@contextlib.contextmanager
def paused(root: int) -> Iterator[list[int]]:
    """``root``'s whole tree stopped until the block ends, then continued (however the block ends)."""
    tree: list[int] = []
    try:
        while True:  # a process started while the tree was being stopped is stopped too
            new = [pid for pid in process_tree(root) if pid not in tree]
            if not new:
                break
            _signal_all(new, signal.SIGSTOP)
            tree.extend(new)
        yield tree
    finally:
        _signal_all(reversed(tree), signal.SIGCONT)
