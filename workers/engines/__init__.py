"""Engines as plug-ins: one sub-package per engine (``simulated``, ``vllm``), each registering an
``EnginePlugin`` (``fairgate.workers.engines.interface``). The rest of the gateway finds an engine by the name
in the configuration (``engine_for``) and never branches on which one it is. Adding an engine is one
new sub-package here; importing this package imports none of the engines' heavy dependencies."""

from __future__ import annotations

from typing import Any

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


def engines_described() -> list[dict[str, Any]]:
    """Every engine as the registries describe their plug-ins (``Registry.describe``): its parameters
    are its settings model's fields (where they sit in the ``workers`` section: ``section``)."""
    rows = []
    for name in engine_names():
        cls = ENGINES[name]
        model = cls.settings_model
        fields = getattr(model, "model_fields", {}) if model is not None else {}
        params = [
            {
                "name": key,
                "type": str(info.annotation),
                "default": None if info.is_required() else info.get_default(call_default_factory=True),
                "required": info.is_required(),
                "doc": info.description or "",
            }
            for key, info in fields.items()
        ]
        summary = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        rows.append(
            {"name": name, "usage": f"engine: {name}", "summary": summary, "module": cls.__module__, "params": params}
            | {"section": cls.settings_section}
        )
    return rows


discover(__name__, __path__)
