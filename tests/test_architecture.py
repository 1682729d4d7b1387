"""The shape of the code: layers that only point down, small files, short functions.

Layers, from the ground up: `common` (imports nothing of the project), then `engine` and
`broker` (each on its own), then the services `gateway`, `worker` and `kvstore` (none imports
another), then `warmfleet` (the command line, the launcher, the clients) on top. Tests and
benchmarks may import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS = {"common": 0, "engine": 1, "broker": 1, "gateway": 2, "worker": 2, "kvstore": 2,
          "warmfleet": 3}  # fmt: skip
GENERATED = REPO / "common" / "v1"
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 50


def sources(*roots: str) -> list[Path]:
    return sorted(
        p for root in roots for p in (REPO / root).rglob("*.py") if not p.is_relative_to(GENERATED)
    )


def project_imports(path: Path) -> set[str]:
    """The top-level packages of the project that `path` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {n.split(".")[0] for n in names if n.split(".")[0] in LAYERS}
    return found


@pytest.mark.parametrize("package", list(LAYERS))
def test_imports_point_down_and_services_do_not_import_each_other(package: str) -> None:
    wrong = []
    for path in sources(package):
        for target in project_imports(path) - {package}:
            if LAYERS[target] >= LAYERS[package]:
                wrong.append(f"{path.relative_to(REPO)} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_source_file_is_long() -> None:
    long = [
        f"{p.relative_to(REPO)}: {n} lines"
        for p in sources(*LAYERS, "tests", "bench", "proto")
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    ]
    assert not long, "\n".join(long)


def test_no_function_is_long() -> None:
    long = []
    for path in sources(*LAYERS, "tests", "bench", "proto"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {n} lines")
    assert not long, "\n".join(long)
