"""An engine's own OpenAI layer as a plain HTTP server on loopback, without the gateway: what a
fairgate worker serves, measured alone (``fairgate bench openai`` compares the gateway with it; an
engine with a server of its own, like vLLM, is compared with that instead: ``EnginePlugin.reference_server``).

``python -m fairgate.workers.engine_server --engine simulated --settings '{...}' --model NAME --port PORT``
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import uvicorn
from starlette.responses import Response

from fairgate.workers.engines import engine_for


async def engine_app(engine: str, settings: dict, model: str) -> tuple[Any, Any]:
    """The engine started with no dispatcher to report to, and its own OpenAI layer: (runner, app)."""
    plugin = engine_for(engine)
    runner = plugin.runner(plugin.settings(settings), model)
    await runner.start(lambda _report: None)
    app = await runner.openai_app()
    add_serving_routes(app, runner, model)
    return runner, app


def add_serving_routes(app: Any, runner: Any, model: str) -> None:
    """What routers ask of an engine's server besides completions, as vLLM's own server answers them:
    ``/health``, ``/v1/models`` and ``/metrics`` with vLLM's gauges of requests running and waiting
    (routers probe the first two; ``fairgate bench peers`` waits on the last for an idle engine)."""
    engine = getattr(runner, "engine", None)

    async def health() -> Response:
        return Response(status_code=200 if runner.healthy() else 503)

    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "fairgate"}]}

    async def metrics() -> Response:
        running = len(engine.running) if engine is not None else int(runner.has_work())
        waiting = len(engine.waiting) if engine is not None else 0
        text = "".join(
            f'# TYPE vllm:{name} gauge\nvllm:{name}{{model_name="{model}"}} {value}\n'
            for name, value in (("num_requests_running", running), ("num_requests_waiting", waiting))
        )
        return Response(text, media_type="text/plain; version=0.0.4")

    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])


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
