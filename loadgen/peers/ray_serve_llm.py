"""Ray Serve LLM's prefix-aware request router in front of engines served alone: the peer a team
already on Ray would reach for, as a process of its own.

Ray Serve LLM runs its engines inside Serve replicas (``LLMServer``) behind an OpenAI ingress, and
``PrefixCacheAffinityRouter`` picks the replica: the one whose past prompts share the longest prefix
with this one while the replicas' queues are within its imbalance threshold, else the power of two
choices. Here the engines are the bench's shared servers, so each replica stands for one of them (by
its rank) and relays the request to it; the ingress and the router are Serve's and Ray Serve LLM's own,
with its defaults.

``python -m fairgate.loadgen.peers.ray_serve_llm --port PORT --backends URL [URL ...]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

MAX_ONGOING = 1_000  # per replica: the engine behind it queues; Serve's default of 5 would queue in Ray instead


@dataclass
class ChatBody:
    """A chat request as the router reads it (``messages``) with the body to relay."""

    messages: list[Any]
    body: dict[str, Any]
    path: str = "/v1/chat/completions"


@dataclass
class CompletionBody:
    """A text completion as the router reads it (``prompt``) with the body to relay."""

    prompt: Any
    body: dict[str, Any]
    path: str = "/v1/completions"


async def _json(request: Request) -> dict[str, Any] | Response:
    try:
        body = json.loads(await request.body())
    except ValueError:
        body = None
    if not isinstance(body, dict):
        error = {"message": "the body is not a JSON object", "type": "invalid_request_error"}
        return JSONResponse({"error": error}, status_code=400)
    return body


def build_app(backends: list[str]) -> Any:
    import httpx
    from ray import serve
    from ray.serve.config import RequestRouterConfig
    from ray.serve.llm.request_router import PrefixCacheAffinityRouter

    @serve.deployment(
        num_replicas=len(backends),
        max_ongoing_requests=MAX_ONGOING,
        ray_actor_options={"num_cpus": 0},  # relays: the engines' servers do the work
        request_router_config=RequestRouterConfig(request_router_class=PrefixCacheAffinityRouter),
    )
    class EngineReplica:
        def __init__(self) -> None:
            self.base = backends[serve.get_replica_context().rank.rank % len(backends)]
            self.client = httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=MAX_ONGOING))

        async def __call__(self, request: ChatBody | CompletionBody) -> AsyncIterator[Any]:
            async with self.client.stream("POST", self.base + request.path, json=request.body) as r:
                yield (r.status_code, r.headers.get("content-type", "application/json"))
                async for chunk in r.aiter_raw():
                    yield chunk

    web = FastAPI()

    @serve.deployment(max_ongoing_requests=MAX_ONGOING, ray_actor_options={"num_cpus": 0})
    @serve.ingress(web)
    class Ingress:
        def __init__(self, engines: Any) -> None:
            self.engines = engines.options(stream=True)

        async def _relay(self, request: ChatBody | CompletionBody) -> Response:
            chunks = self.engines.remote(request)
            status, kind = await chunks.__anext__()
            if status != 200 or not request.body.get("stream"):
                return Response(b"".join([c async for c in chunks]), status_code=status, media_type=kind)
            return StreamingResponse(chunks, media_type=kind)

        @web.post("/v1/chat/completions")
        async def chat(self, request: Request) -> Response:
            body = await _json(request)
            if isinstance(body, Response):
                return body
            return await self._relay(ChatBody(body.get("messages") or [], body))

        @web.post("/v1/completions")
        async def completions(self, request: Request) -> Response:
            body = await _json(request)
            if isinstance(body, Response):
                return body
            return await self._relay(CompletionBody(body.get("prompt") or "", body))

    return Ingress.bind(EngineReplica.bind())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backends", nargs="+", required=True, help="each engine's server, without /v1")
    args = parser.parse_args()
    from ray import serve

    from fairgate.gateway.app import start_local_ray

    start_local_ray()
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(build_app(args.backends), name="ray-serve-llm", route_prefix="/")
    stop = asyncio.Event()

    async def wait() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        await stop.wait()

    asyncio.run(wait())
    serve.shutdown()
    import ray

    ray.shutdown()


if __name__ == "__main__":
    main()
