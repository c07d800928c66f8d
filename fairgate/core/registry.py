"""Plug-ins of one kind, found by name: the fairness policies and the placement rules each keep one.

A plug-in package registers every module it holds (``discover``), so adding a plug-in is adding one
module; each module registers its class with the package's ``Registry.register`` decorator.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from typing import ClassVar, Generic, Protocol, TypeVar


class Named(Protocol):
    """A plug-in class: known by its name."""

    name: ClassVar[str]


T = TypeVar("T", bound=type[Named])


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


def discover(package: str, path: Iterable[str]) -> None:
    """Import every module of a plug-in package (each registers what it defines)."""
    for module in pkgutil.iter_modules(path):
        if module.name != "base":
            importlib.import_module(f"{package}.{module.name}")
