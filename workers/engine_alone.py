"""Starting an engine's own OpenAI layer alone (``fairgate.workers.engine_server``) as a process of its own, for
as long as a block runs: the reference ``fairgate bench openai`` compares the gateway with. Kept apart
from the server itself, which looks the engine up by name, so that the engine interface can start it
without importing the registry it is part of."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


@contextlib.contextmanager
def engine_alone(engine: str, settings: dict, model: str, port: int, log: Path | None = None) -> Iterator[str]:
    """This module as a server process until the block ends; yields its base URL (``.../v1``)."""
    args = ["--engine", engine, "--settings", json.dumps(settings), "--model", model, "--port", str(port)]
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "fairgate.workers.engine_server", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        process_group=0,  # not a session of its own: see reference_server.py (autogroup)
    )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the engine's server exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(base + "/chat/completions", json={}, timeout=2)
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the engine's server did not start within 120 s")
            time.sleep(0.3)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        if log is not None:
            out.close()  # type: ignore[union-attr]
