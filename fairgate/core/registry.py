"""Plug-ins of one kind, found by name, and the one way every plug-in takes parameters.

A plug-in package registers every module it holds (``discover``), so adding a plug-in is adding one
module; each module registers its class with the package's ``Registry.register`` decorator.

Every plug-in (a fairness policy, a placement rule; an engine in ``fairgate.workers.engines``, a
bench in ``fairgate.loadgen.benches``) is chosen by name and given named parameters. A class states
its parameters (``params``: a ``Param`` each, typed, with a default and a line saying what it does);
a spec names the plug-in and gives some of them, as a mapping (``{name: vtc-locality, slack: 500}``)
or as text (``vtc-locality:500`` sets the first parameter, ``name:key=value,key=value`` any). The
registry checks a spec against the class (unknown or missing parameters, values of the wrong type)
and builds the plug-in with the values typed; ``spec_text`` writes the spec that builds it again.
The reference pages are generated from ``Registry.describe``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

REQUIRED: Any = object()  # a parameter's default when a spec must give it


@dataclass(frozen=True)
class Param:
    """One parameter of a plug-in: its name, type (int, float, str or bool), default, and meaning."""

    name: str
    kind: type
    default: Any = REQUIRED
    doc: str = ""

    def typed(self, value: Any, owner: str) -> Any:
        """``value`` (from YAML, or text from a spec or the command line) as this parameter's type."""
        try:
            if self.kind is bool:
                if isinstance(value, str) and value.lower() in ("true", "false"):
                    return value.lower() == "true"
                if isinstance(value, bool):
                    return value
                raise ValueError
            if self.kind is int:
                number = float(value) if isinstance(value, str) else value
                if isinstance(number, bool) or not isinstance(number, (int, float)) or number != int(number):
                    raise ValueError
                return int(number)
            if self.kind is float:
                if isinstance(value, bool):
                    raise ValueError
                return float(value)
            return self.kind(value)
        except (TypeError, ValueError):
            raise ValueError(f"{owner}: {self.name} must be {_kind_word(self.kind)}, got {value!r}") from None


class Named(Protocol):
    """A plug-in class: known by its name, with its parameters stated."""

    name: ClassVar[str]
    params: ClassVar[tuple[Param, ...]]


T = TypeVar("T", bound=type[Named])


def parse_spec(spec: str | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(name, given parameters) of a spec: ``name``, ``name:value`` (the plug-in's first parameter,
    returned under the key ""), ``name:key=value,...``, or a mapping with ``name`` and parameters."""
    if isinstance(spec, Mapping):
        mapped = dict(spec)
        named = mapped.pop("name", None)
        if not isinstance(named, str) or not named.strip():
            raise ValueError(f"a plug-in spec needs a name, got {dict(spec)!r}")
        return named.strip().lower(), mapped
    text = str(spec).strip()
    name, sep, rest = text.partition(":")
    if not sep:
        return name.lower(), {}
    if "=" not in rest:
        return name.lower(), {"": rest}
    given: dict[str, Any] = {}
    for part in rest.split(","):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{text!r}: parameters are written key=value, separated by commas")
        given[key.strip()] = value.strip()
    return name.lower(), given


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._by_name: dict[str, T] = {}

    def register(self, cls: T) -> T:
        """Class decorator: make ``cls`` known by its ``name``."""
        name = cls.name
        if self._by_name.get(name, cls) is not cls:
            raise ValueError(f"two {self.kind}s are named {name!r}")
        self._by_name[name] = cls
        return cls

    def get(self, name: str) -> T | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def __getitem__(self, name: str) -> T:
        return self._by_name[name]

    def resolve(self, spec: str | Mapping[str, Any]) -> tuple[T, dict[str, Any]]:
        """The class a spec names and its parameters, every one given or defaulted, typed. Raises
        ValueError naming what is wrong (an unknown plug-in, an unknown, missing or ill-typed parameter)."""
        name, given = parse_spec(spec)
        cls = self._by_name.get(name)
        if cls is None:
            raise ValueError(f"unknown {self.kind} {spec!r} (expected one of: {', '.join(self.usages())})")
        if "" in given:  # name:value sets the first parameter
            if not cls.params:
                raise ValueError(f"{self.kind} {name!r} takes no parameter, got {spec!r}")
            given[cls.params[0].name] = given.pop("")
        known = {p.name: p for p in cls.params}
        unknown = sorted(set(given) - set(known))
        if unknown:
            takes = ", ".join(known) or "none"
            raise ValueError(f"{self.kind} {name!r}: unknown parameter {unknown[0]!r} (it takes: {takes})")
        values: dict[str, Any] = {}
        for p in cls.params:
            if p.name in given:
                values[p.name] = p.typed(given[p.name], f"{self.kind} {name!r}")
            elif p.default is REQUIRED:
                raise ValueError(f"{self.kind} {name!r} needs {p.name} ({p.doc}), e.g. {usage(cls)}")
            else:
                values[p.name] = p.default
        return cls, values

    def usages(self) -> list[str]:
        """How each plug-in is written, e.g. ``rpm:LIMIT``."""
        return [usage(self._by_name[name]) for name in self.names()]

    def describe(self) -> list[dict[str, Any]]:
        """Every plug-in: its name, how it is written, its summary and its parameters (for the reference)."""
        rows = []
        for name in self.names():
            cls = self._by_name[name]
            doc = (cls.__doc__ or "").strip()
            rows.append(
                {
                    "name": name,
                    "usage": usage(cls),
                    "summary": " ".join(doc.split("\n\n")[0].split()),
                    "module": cls.__module__,
                    "params": [
                        {
                            "name": p.name,
                            "type": _kind_word(p.kind),
                            "default": None if p.default is REQUIRED else p.default,
                            "required": p.default is REQUIRED,
                            "doc": p.doc,
                        }
                        for p in cls.params
                    ],
                }
            )
        return rows


def usage(cls: type[Named]) -> str:
    """``name``, or ``name[:FIRST]`` (``name:FIRST`` when it must be given)."""
    if not cls.params:
        return cls.name
    first = cls.params[0]
    return f"{cls.name}:{first.name.upper()}" if first.default is REQUIRED else f"{cls.name}[:{first.name.upper()}]"


def spec_text(cls: type[Named], values: Mapping[str, Any]) -> str:
    """The shortest text that builds a plug-in of ``cls`` with ``values`` again."""
    changed = [p for p in cls.params if p.default is REQUIRED or values[p.name] != p.default]
    if not changed:
        return cls.name
    if len(changed) == 1 and changed[0] is cls.params[0]:
        return f"{cls.name}:{_text(values[changed[0].name])}"
    return f"{cls.name}:" + ",".join(f"{p.name}={_text(values[p.name])}" for p in changed)


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value).lower() if isinstance(value, bool) else str(value)


def _kind_word(kind: type) -> str:
    return {int: "a whole number", float: "a number", bool: "true or false", str: "text"}.get(kind, kind.__name__)


def discover(package: str, path: Iterable[str]) -> None:
    """Import every module of a plug-in package (each registers what it defines)."""
    for module in pkgutil.iter_modules(path):
        if module.name != "base":
            importlib.import_module(f"{package}.{module.name}")
