"""An engine's own OpenAI layer as a plain HTTP server on loopback, without the gateway: what a
fairgate worker serves, measured alone (``fairgate bench openai`` compares the gateway with it; an
engine with a server of its own, like vLLM, is compared with that instead: ``EnginePlugin.reference_server``).

``python -m workers.engine_server --engine simulated --settings '{...}' --model NAME --port PORT``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from workers.engines import engine_for


async def engine_app(engine: str, settings: dict, model: str) -> tuple[Any, Any]:
    """The engine started with no dispatcher to report to, and its own OpenAI layer: (runner, app)."""
    plugin = engine_for(engine)
    runner = plugin.runner(plugin.settings(settings), model)
    await runner.start(lambda _report: None)
    return runner, await runner.openai_app()


async def serve_engine(engine: str, settings: dict, model: str, port: int) -> None:
    runner, app = await engine_app(engine, settings, model)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    try:
        await server.serve()
    finally:
        await runner.stop()


@contextlib.contextmanager
def engine_alone(engine: str, settings: dict, model: str, port: int, log: Path | None = None) -> Iterator[str]:
    """This module as a server process until the block ends; yields its base URL (``.../v1``)."""
    args = ["--engine", engine, "--settings", json.dumps(settings), "--model", model, "--port", str(port)]
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.engine_server", *args],
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="simulated")
    parser.add_argument("--settings", default="{}", help="the engine's settings as JSON (as in the config)")
    parser.add_argument("--model", default="fairgate-sim")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(serve_engine(args.engine, json.loads(args.settings), args.model, args.port))


if __name__ == "__main__":
    main()
