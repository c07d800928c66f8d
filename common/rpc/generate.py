"""Generate the Python gRPC stubs from ``proto/`` (run ``python -m common.rpc.generate``).

The stubs are committed so an install needs no code generation; ``tests/unit/test_rpc_stubs.py`` regenerates
them into a temporary folder and fails when the committed ones differ.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
PROTO_FILES = ["common/rpc/fairgate.proto"]
GENERATED = ["fairgate_pb2.py", "fairgate_pb2.pyi", "fairgate_pb2_grpc.py"]


def generate(out_root: Path) -> list[Path]:
    """Write the stubs under ``out_root`` (which mirrors the repository root); return their paths."""
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
    return [out_root / "common" / "rpc" / name for name in GENERATED]


def stale_files() -> list[str]:
    """Names of committed stubs that differ from freshly generated ones."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        here = REPO / "common" / "rpc"
        return [p.name for p in fresh if not (here / p.name).is_file() or (here / p.name).read_text() != p.read_text()]


if __name__ == "__main__":
    written = generate(REPO)
    print("\n".join(str(p.relative_to(REPO)) for p in written))
    sys.exit(0)
