"""The layout rule (docs/layout.md): every package stands above what it uses, and no import runs back up.

Everything is one import root, ``fairgate``; each layer below the command keeps a folder of its own in
the repository, mapped under the root by ``pyproject.toml`` (``package-dir``). The order, lowest first
(a module may import from its own layer and the layers below it):

1. ``fairgate.core`` (``fairgate/core/``): the pure core. Only the standard library and itself.
2. ``fairgate.common`` (``common/``): the shared floor (wire stubs, tickets, tracing, loopback, sections).
3. ``fairgate.dispatcher`` (``dispatcher/``): the control plane's shells (service, actor, state, registry).
4. ``fairgate.workers`` (``workers/``): the engine plug-ins, the worker shell and its deployment.
5. ``fairgate.ingress`` (``ingress/``): the HTTP front.
6. ``fairgate.gateway`` (``gateway/``): the application assembled from all of the above.
7. ``fairgate.loadgen`` (``loadgen/``): workloads, the simulator, the replay, benches.
8. ``fairgate.cli`` and the root package: the command line.

Also: no two files import each other, directly or in a ring (an import inside a function or under
``TYPE_CHECKING`` counts: it only hides the ring); every import of the project's own code names the
root (a folder imported by its own name would load a second copy of its modules); nothing under
``dispatcher/`` imports an engine (``fairgate.workers.engines`` or an engine's libraries), and no code
outside ``workers/`` branches on an engine's name.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

from fairgate.workers.engines import engine_names
from tests.conftest import REPO

LAYERS = [
    "fairgate.core",
    "fairgate.common",
    "fairgate.dispatcher",
    "fairgate.workers",
    "fairgate.ingress",
    "fairgate.gateway",
    "fairgate.loadgen",
    "fairgate.cli",
    "fairgate",  # the root package itself (``python -m fairgate``): last, as every name starts with it
]
ENGINE_LIBRARIES = {"vllm", "torch", "transformers", "tokenizers"}
# package -> its folder, as the wheel is built (a package not named here lies inside its parent's folder)
PACKAGE_DIRS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
FOLDERS = {REPO / folder: package for package, folder in PACKAGE_DIRS.items()}


def layer_of(module: str) -> int | None:
    """The layer of a project module (None for anything that is not the project's)."""
    for index, name in enumerate(LAYERS):  # each layer's name comes before the root's
        if module == name or module.startswith(name + "."):
            return index
    return None


def module_name(path: Path) -> str:
    """The module a file is installed as: its folder's package, then its path inside that folder."""
    folder = max((f for f in FOLDERS if path.is_relative_to(f)), key=lambda f: len(f.parts))
    parts = [FOLDERS[folder], *path.relative_to(folder).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, at any depth, relative ones resolved."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    return imports_in(path.read_text(), package)


def import_statements(source: str, package: list[str]) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, module, names imported from it: none for ``import module``) of every import."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out.append((node.lineno, module, tuple(alias.name for alias in node.names)))
    return out


def imports_in(source: str, package: list[str]) -> list[tuple[int, str]]:
    return [(line, module) for line, module, _ in import_statements(source, package)]


def project_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in folder.rglob("*.py"))


def file_imports(source: str, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The project's files a file's source imports: ``from package import name`` is the module
    ``package.name`` when that is a file, else the package's ``__init__`` (importing a submodule runs its
    package's ``__init__`` first for everyone, so that edge is no one's choice and is left out)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    targets: set[str] = set()
    for _, named, names in import_statements(source, package):
        submodules = {f"{named}.{name}" for name in names} & modules
        targets |= submodules if names and len(submodules) == len(names) else submodules | {named}
    found = set()
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != module:
            found.add(target)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every ring of files that import each other (strongly connected parts of more than one file)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    rings: list[list[str]] = []

    def visit(root: str) -> None:  # Tarjan's, with an explicit stack of (module, its remaining imports)
        work = [(root, iter(sorted(graph.get(root, ()))))]
        order[root] = low[root] = len(order)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, rest = work[-1]
            child = next(rest, None)
            if child is not None:
                if child not in order:
                    order[child] = low[child] = len(order)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], order[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == order[node]:
                ring = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    ring.append(member)
                    if member == node:
                        break
                if len(ring) > 1:
                    rings.append(sorted(ring))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return rings


def project_graph(overrides: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Module -> the project's modules it imports, from the sources (``overrides``: module -> source
    used instead of its file's, for the test of the test)."""
    files = {module_name(p): p for p in project_files()}
    modules = set(files)
    sources = {m: p.read_text() for m, p in files.items()} | (overrides or {})
    return {m: file_imports(src, m, files[m].name == "__init__.py", modules) for m, src in sources.items()}


def test_no_files_import_each_other():
    rings = import_cycles(project_graph())
    assert not rings, "files that import each other: " + "; ".join(" <-> ".join(r) for r in rings)


def test_the_cycle_check_has_teeth():
    """A ring planted back (the engine interface importing the server that looks engines up, deferred
    as it once was) and an upward import (the core importing its shell) are both found."""
    interface = REPO / "workers" / "engines" / "interface.py"
    planted = interface.read_text() + "\n\ndef _late():\n    from fairgate.workers.engine_server import engine_app\n"
    rings = import_cycles(project_graph({"fairgate.workers.engines.interface": planted}))
    assert ["fairgate.workers.engine_server", "fairgate.workers.engines", "fairgate.workers.engines.interface"] in rings
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    upward = imports_in(
        "def f():\n    from fairgate.dispatcher.service import DispatcherService\n", ["fairgate", "core"]
    )
    assert any(layer_of(m) > layer_of("fairgate.core.scheduler") for _, m in upward)


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


FOLDER_NAMES = {folder.name for folder in FOLDERS if folder.name != "fairgate"}


@pytest.mark.parametrize("path", project_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_import_of_the_project_names_the_root(path):
    for line, module in imports_of(path):
        assert module.split(".")[0] not in FOLDER_NAMES, f"{path.relative_to(REPO)}:{line} imports {module}"


def test_the_core_imports_only_the_standard_library_and_itself():
    for path in (REPO / "fairgate" / "core").rglob("*.py"):
        for line, module in imports_of(path):
            top = module.split(".")[0]
            ok = module.startswith("fairgate.core") or (top in sys.stdlib_module_names and top != "asyncio")
            assert ok, f"{path.relative_to(REPO)}:{line} imports {module}"


def test_the_core_silences_no_type_error():
    """mypy checks the core strictly (the test command runs it); nothing there is waved through."""
    for path in (REPO / "fairgate" / "core").rglob("*.py"):
        assert "type: ignore" not in path.read_text(), f"{path.relative_to(REPO)} silences the type checker"


def test_the_dispatcher_imports_no_engine():
    for path in (REPO / "dispatcher").rglob("*.py"):
        for line, module in imports_of(path):
            assert not module.startswith("fairgate.workers"), f"{path.relative_to(REPO)}:{line} imports {module}"
            assert module.split(".")[0] not in ENGINE_LIBRARIES, f"{path.relative_to(REPO)}:{line} imports {module}"


def test_no_code_outside_workers_branches_on_an_engine_name():
    names = set(engine_names())
    for path in project_files():
        if module_name(path).startswith("fairgate.workers"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                constants = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                hit = names.intersection(c for c in constants if isinstance(c, str))
                assert not hit, f"{path.relative_to(REPO)}:{node.lineno} compares with engine name {hit}"


def test_the_check_has_teeth():
    """Imports inside functions and relative ones are seen; the layers order them as stated."""
    source = "import ray\ndef f():\n    from fairgate.ingress.deployment import Ingress\nfrom ..core import model\n"
    found = sorted(module for _, module in imports_in(source, ["fairgate", "dispatcher"]))
    assert found == ["fairgate.core", "fairgate.ingress.deployment", "ray"]
    assert layer_of("fairgate.ingress.deployment") > layer_of("fairgate.dispatcher.service")
    assert layer_of("fairgate.dispatcher.service") > layer_of("fairgate.common.sections")
    assert layer_of("fairgate.core.scheduler") == 0 and layer_of("ray") is None
    assert layer_of("fairgate.cli.bench") < layer_of("fairgate.__main__") == len(LAYERS) - 1
    assert module_name(REPO / "dispatcher" / "actor.py") == "fairgate.dispatcher.actor"
    assert module_name(REPO / "fairgate" / "core" / "policies" / "__init__.py") == "fairgate.core.policies"
    assert [m for _, m in imports_in("from common.frames import x\nimport loadgen\n", ["fairgate"])] == [
        "common.frames",
        "loadgen",
    ]  # what the next test refuses
