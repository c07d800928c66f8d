"""An engine's own OpenAI layer as a plain HTTP server on loopback, without the gateway: what a
fairgate worker serves, measured alone (``fairgate bench openai`` compares the gateway with it; an
engine with a server of its own, like vLLM, is compared with that instead: ``EnginePlugin.reference_server``).

``python -m workers.engine_server --engine simulated --settings '{...}' --model NAME --port PORT``
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

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
