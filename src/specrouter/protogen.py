"""Regenerates the Python code of `proto/` into `src/specrouter/` with grpcio-tools.

    python -m specrouter.protogen

The `.proto` files live under `proto/specrouter/v1/`, mirroring the Python package `specrouter.v1`, so
generated modules import each other as `specrouter.v1.*`. `tests/test_proto_drift.py` fails when the
checked-in code differs from what this produces.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "proto"
PYTHON_ROOT = REPO_ROOT / "src"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    return sorted(proto_root.rglob("*.proto"))


def generate(out: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Generates `*_pb2.py`, `*_pb2.pyi` and `*_pb2_grpc.py` for every `.proto` under `proto_root` into `out`."""
    from grpc_tools import protoc

    well_known = resources.files("grpc_tools") / "_proto"
    files = [p.relative_to(proto_root).as_posix() for p in proto_files(proto_root)]
    out.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{proto_root}", f"-I{well_known}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", *files]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {files}")
    return sorted(p for p in out.rglob("*") if p.name.endswith(GENERATED_SUFFIXES))


def generated_files(python_root: Path = PYTHON_ROOT) -> list[Path]:
    return sorted(p for p in (python_root / "specrouter" / "v1").glob("*") if p.name.endswith(GENERATED_SUFFIXES))


def main() -> int:
    for stale in generated_files():
        stale.unlink()
    for path in generate(PYTHON_ROOT):
        print(path.relative_to(REPO_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
