"""The ingress's ASGI application: the two generation routes served directly, everything else by
FastAPI.

Every generated token's request goes through ``POST /v1/chat/completions`` or ``/v1/completions``;
on those two, FastAPI's router, middleware stack and dependency solving cost about a tenth of the
ingress's CPU per short request here, for nothing they add (the handler reads the raw body and
validates it itself). The admin, models, metrics and dashboard routes keep FastAPI.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from fairgate.common.openai_errors import ApiError

log = logging.getLogger(__name__)

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
GENERATION_ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


class ByteRelay:
    """A streamed answer: the engine's bytes as they come, as one HTTP response. The byte source is
    closed however the response ends (the client leaving included: the server cancels the call), so
    the worker's request never outlives its client."""

    def __init__(self, pieces: AsyncIterator[bytes], status: int, content_type: str) -> None:
        self.pieces = pieces
        self.status = status
        self.headers = [(b"content-type", content_type.encode("latin-1"))]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
            async for piece in self.pieces:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await self.pieces.aclose()  # type: ignore[attr-defined]


class Routes(Protocol):
    """What the ingress deployment answers (``fairgate.ingress.deployment.Ingress``)."""

    async def generation(self, request: Request, endpoint: str) -> ASGIApp: ...

    def add_routes(self, app: FastAPI) -> None: ...


def internal_error(exc: BaseException) -> JSONResponse:
    """A bug must not show its insides to clients: the details go to the log only."""
    log.error("ingress: unexpected %s", type(exc).__name__, exc_info=exc)
    return ApiError(500, "the gateway failed on this request", type_="server_error", code="internal_error").response()


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    return internal_error(exc)


def build_http_app(routes: Routes) -> ASGIApp:
    rest = FastAPI(title="fairgate", version="0.1.0", docs_url=None, redoc_url=None, openapi_url=None)  # no route map
    rest.add_exception_handler(ApiError, _api_error)
    rest.add_exception_handler(Exception, _unexpected)
    routes.add_routes(rest)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        endpoint = None
        if scope["type"] == "http" and scope["method"] == "POST":
            path, root = scope["path"], scope.get("root_path", "")
            endpoint = GENERATION_ROUTES.get(path[len(root) :] if root and path.startswith(root) else path)
        if endpoint is None:
            await rest(scope, receive, send)
            return
        try:
            response = await routes.generation(Request(scope, receive), endpoint)
        except ApiError as exc:
            response = exc.response()
        except Exception as exc:
            response = internal_error(exc)
        await response(scope, receive, send)

    return app
