"""The package as users install it: one import root, every module of the repository's folders in it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"  # a copy: a build folder left in the repository would add what it holds
    shutil.copytree(
        REPO, source, ignore=shutil.ignore_patterns(".*", "build", "site", "out", "__pycache__", "*.egg-info")
    )
    build = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(out),
        str(source),
    ]
    subprocess.run(build, check=True, capture_output=True, cwd=out)
    (found,) = out.glob("fairgate-*.whl")
    return found


def test_the_wheel_puts_one_package_on_the_path(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"fairgate", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}


def test_every_module_and_data_file_of_the_folders_is_in_the_wheel(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, folder in setuptools["package-dir"].items():
        for path in (REPO / folder).rglob("*.py"):
            installed = "/".join([*package.split("."), *path.relative_to(REPO / folder).parts])
            assert installed in names, f"{path.relative_to(REPO)} is not installed (packages in pyproject.toml?)"
    for package, patterns in setuptools["package-data"].items():
        folder = REPO / setuptools["package-dir"].get(package, package.replace(".", "/"))
        if package not in setuptools["package-dir"]:  # inside its parent's folder
            parent, _, child = package.rpartition(".")
            folder = REPO / setuptools["package-dir"][parent] / child
        for pattern in patterns:
            for path in folder.glob(pattern):
                installed = "/".join([*package.split("."), *path.relative_to(folder).parts])
                assert installed in names, f"{path.relative_to(REPO)} is not installed"


def test_the_installed_package_imports_from_anywhere(wheel, tmp_path):
    target = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)]
    subprocess.run(install, check=True, capture_output=True)
    probe = (
        "import fairgate.gateway.app, fairgate.gateway.config as c, fairgate.loadgen.trace as t;"
        f"assert fairgate.gateway.app.__file__.startswith({str(target)!r}), fairgate.gateway.app.__file__;"
        "c.load_config(); t.synthesize_arena_trace(0)"
    )
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
