"""Generate the Python gRPC stubs from ``proto/`` (run ``python -m fairgate.common.rpc.generate``).

The stubs are committed so an install needs no code generation; ``tests/unit/test_rpc_stubs.py`` regenerates
them into a temporary folder and fails when the committed ones differ.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
PROTO_FILES = ["fairgate/common/rpc/fairgate.proto"]  # its path is the stubs' import path (fairgate.common.rpc)
GENERATED = ["fairgate_pb2.py", "fairgate_pb2.pyi", "fairgate_pb2_grpc.py"]


def generate(out_root: Path) -> list[Path]:
    """Write the stubs under ``out_root`` (in the folders of their import path); return their paths."""
    from grpc_tools import protoc

    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *PROTO_FILES,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed: " + " ".join(args))
    return [out_root / "fairgate" / "common" / "rpc" / name for name in GENERATED]


def stale_files() -> list[str]:
    """Names of committed stubs that differ from freshly generated ones."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        here = REPO / "common" / "rpc"
        return [p.name for p in fresh if not (here / p.name).is_file() or (here / p.name).read_text() != p.read_text()]


if __name__ == "__main__":
    here = REPO / "common" / "rpc"
    with tempfile.TemporaryDirectory() as tmp:
        for fresh in generate(Path(tmp)):
            (here / fresh.name).write_text(fresh.read_text())
            print((here / fresh.name).relative_to(REPO))
    sys.exit(0)
