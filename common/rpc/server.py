"""Starting one of fairgate's gRPC servers: the dispatcher's two services and the worker's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc


async def start_server(add_servicer: Callable[[Any, grpc.aio.Server], None], servicer: Any, host: str, port: int = 0):
    """A started ``grpc.aio`` server with ``servicer`` on ``host:port`` (0: any free port); returns the
    server and the address it listens on."""
    server = grpc.aio.server()
    add_servicer(servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server, f"{host}:{bound}"
