"""The committed generated code is what proto/generate.py makes from the .proto files,
whichever patch release of grpcio-tools the machine installed (its version stamps aside)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


# what a generator's release writes into its code: the version of grpcio (the least the code
# then accepts at run time) and of protoc; pyproject.toml allows newer patch releases
_STAMPS = (
    re.compile(r"^GRPC_GENERATED_VERSION = '[^']*'$", re.M),
    re.compile(r"^# Protobuf Python Version: .*$", re.M),
    re.compile(r"(_runtime_version\.Domain\.PUBLIC,\n)(\s*\d+,\n){3}"),
)


def unstamped(code: str) -> str:
    """The generated code without the generator's version stamps."""
    for stamp in _STAMPS:
        code = stamp.sub("<version>", code)
    return code


def load_generator():  # proto/ is not a package: load the script by path
    spec = importlib.util.spec_from_file_location("proto_generate", REPO / "proto" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    written = load_generator().generate(tmp_path)
    names = {p.relative_to(tmp_path).as_posix() for p in written}
    assert names == {
        f"common/v1/{stem}{suffix}"
        for stem in ("inference", "kvstore")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
    }
    for name in names:
        fresh = (tmp_path / name).read_text()
        committed = (REPO / name).read_text()
        assert unstamped(committed) == unstamped(fresh), (
            f"{name} is stale: run .venv/bin/python proto/generate.py"
        )
