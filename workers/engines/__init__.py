"""Engines as plug-ins: one sub-package per engine (``simulated``, ``vllm``), each registering an
``EnginePlugin`` (``fairgate.workers.engines.interface``). The rest of the gateway finds an engine by the name
in the configuration (``engine_for``) and never branches on which one it is. Adding an engine is one
new sub-package here; importing this package imports none of the engines' heavy dependencies."""

from __future__ import annotations

from fairgate.core.registry import Registry, discover
from fairgate.workers.engines.interface import EnginePlugin

ENGINES: Registry[type[EnginePlugin]] = Registry("engine")
register = ENGINES.register


def engine_names() -> list[str]:
    return ENGINES.names()


def engine_for(name: str) -> EnginePlugin:
    cls = ENGINES.get(name)
    if cls is None:
        raise ValueError(f"workers.engine must be one of {', '.join(engine_names())}, got {name!r}")
    return cls()


discover(__name__, __path__)
