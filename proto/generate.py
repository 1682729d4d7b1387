"""Regenerate the committed Python code for the .proto files under proto/.

    .venv/bin/python proto/generate.py

Writes common/v1/inference_pb2.py, .pyi and _pb2_grpc.py; tests/unit/test_proto.py fails when the
committed files differ from what this produces.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
REPO = PROTO_ROOT.parent
PROTOS = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in PROTO_ROOT.rglob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on every .proto into `out_dir`; returns the files written."""
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *PROTOS,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    stems = [out_dir / p.removesuffix(".proto") for p in PROTOS]
    return [
        Path(f"{s}{suffix}") for s in stems for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
    ]


if __name__ == "__main__":
    for path in generate(REPO):
        print(path.relative_to(REPO))
    sys.exit(0)
