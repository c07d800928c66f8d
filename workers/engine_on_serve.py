"""An engine's own OpenAI layer inside one bare Ray Serve replica behind Serve's front door, with
nothing of fairgate around it: no authentication, no dispatcher, no relay.

``fairgate bench openai`` measures it beside the engine alone and the gateway, as the floor of any
gateway built on Ray Serve replicas: what Serve's request path costs before fairgate does anything.
The engine is built in the replica on its first request (its runner needs the replica's event loop).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from ray import serve

# (engine, settings, model), set by the replica's constructor through ``_configure``. Serve ships the
# ingress class and its app to the replica as copies (with copies of this module's globals), while
# ``_LazyEngine`` and ``_configure`` are imported there: they share the module's real globals.
_SPEC: list[Any] = []


def _configure(engine: str, settings: dict[str, Any], model: str) -> None:
    _SPEC[:] = [engine, settings, model]


class _LazyEngine:
    """An ASGI app that builds the engine and its layer on the first request, then passes every
    request to that layer unchanged."""

    def __init__(self) -> None:
        self._app: Any = None
        self._lock: asyncio.Lock | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self._app is None:
            self._lock = self._lock or asyncio.Lock()
            async with self._lock:
                if self._app is None:
                    self._app = await self._build()
        await self._app(scope, receive, send)

    async def _build(self) -> Any:
        from workers.engine_server import engine_app

        if not _SPEC:
            raise RuntimeError("the replica was not given its engine")
        engine, settings, model = _SPEC
        return (await engine_app(engine, settings, model))[1]


app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
app.mount("/", _LazyEngine())


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000)
@serve.ingress(app)
class EngineOnServe:
    def __init__(self, engine: str, settings: dict[str, Any], model: str) -> None:
        _configure(engine, settings, model)
