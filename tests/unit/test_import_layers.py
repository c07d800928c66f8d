"""The layout rule (DESIGN §3): every package stands above what it uses, and no import runs back up.

The order, lowest first (a module may import from its own layer and the layers below it):

1. ``dispatcher.core``: the pure core. Only the standard library and itself.
2. ``common``: the shared floor (wire stubs, tickets, tracing, loopback, configuration schema).
3. ``dispatcher``: the control plane's shells (service, actor, state, registry, metrics).
4. ``workers``: the engine plug-ins, the worker shell and its deployment.
5. ``ingress``: the HTTP front.
6. ``gateway``: the application assembled from all of the above.
7. ``loadgen``: workloads, the simulator, the replay, benches.
8. ``fairgate``: the command line.

Also: nothing under ``dispatcher/`` imports an engine (``workers.engines`` or an engine's libraries),
and no code outside ``workers/`` branches on an engine's name.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from workers.engines import engine_names

LAYERS = ["dispatcher.core", "common", "dispatcher", "workers", "ingress", "gateway", "loadgen", "fairgate"]
ENGINE_LIBRARIES = {"vllm", "torch", "transformers", "tokenizers"}


def layer_of(module: str) -> int | None:
    """The layer of a project module (None for anything that is not the project's)."""
    for index, name in enumerate(LAYERS):  # dispatcher.core comes before dispatcher
        if module == name or module.startswith(name + "."):
            return index
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, at any depth, relative ones resolved."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    return imports_in(path.read_text(), package)


def imports_in(source: str, package: list[str]) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out.append((node.lineno, module))
    return out


def project_files() -> list[Path]:
    return sorted(p for top in {name.split(".")[0] for name in LAYERS} for p in (REPO / top).rglob("*.py"))


def test_every_module_belongs_to_a_layer():
    files = project_files()
    assert len(files) > 50
    assert all(layer_of(module_name(p)) is not None for p in files)


@pytest.mark.parametrize("path", project_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_import_runs_back_up(path):
    mine = layer_of(module_name(path))
    for line, module in imports_of(path):
        theirs = layer_of(module)
        if theirs is not None:
            where = f"{path.relative_to(REPO)}:{line}"
            assert theirs <= mine, f"{where} imports {module}, of a higher layer ({LAYERS[theirs]})"


def test_the_core_imports_only_the_standard_library_and_itself():
    for path in (REPO / "dispatcher" / "core").rglob("*.py"):
        for line, module in imports_of(path):
            top = module.split(".")[0]
            ok = module.startswith("dispatcher.core") or (top in sys.stdlib_module_names and top != "asyncio")
            assert ok, f"{path.relative_to(REPO)}:{line} imports {module}"


def test_the_dispatcher_imports_no_engine():
    for path in (REPO / "dispatcher").rglob("*.py"):
        for line, module in imports_of(path):
            assert not module.startswith("workers"), f"{path.relative_to(REPO)}:{line} imports {module}"
            assert module.split(".")[0] not in ENGINE_LIBRARIES, f"{path.relative_to(REPO)}:{line} imports {module}"


def test_no_code_outside_workers_branches_on_an_engine_name():
    names = set(engine_names())
    for path in project_files():
        if module_name(path).startswith("workers"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                constants = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                hit = names.intersection(c for c in constants if isinstance(c, str))
                assert not hit, f"{path.relative_to(REPO)}:{node.lineno} compares with engine name {hit}"


def test_the_check_has_teeth():
    """Imports inside functions and relative ones are seen; the layers order them as stated."""
    source = "import ray\ndef f():\n    from ingress.deployment import Ingress\nfrom ..core import model\n"
    found = sorted(module for _, module in imports_in(source, ["dispatcher", "service"]))
    assert found == ["dispatcher.core", "ingress.deployment", "ray"]
    assert layer_of("ingress.deployment") > layer_of("dispatcher.service") > layer_of("common.config")
    assert layer_of("dispatcher.core.scheduler") == 0 and layer_of("ray") is None
