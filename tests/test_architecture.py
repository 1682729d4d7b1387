"""The shape of the code: layers that only point down, no import circles, each process
importing only its part of the engine, small files, short functions, and a map
(ARCHITECTURE.md) that names every module and only what exists.

Layers, from the ground up: `common` (imports nothing of the project), then `engine` and
`broker` (each on its own), then the services `gateway`, `worker` and `kvstore` (none imports
another), then `warmfleet` (the command line, the launcher, the clients) on top. Tests and
benchmarks may import anything. Of the engine, the gateway imports only its text package
and the kvstore only its KV file formats.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
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


# ---- the import graph of the product ------------------------------------------------


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path) -> Iterator[str]:
    """Every module name `path` imports, wherever the import is (in a function, under
    TYPE_CHECKING): `from a import b` gives a.b (the module, if b is one) and a."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield module
            yield from (f"{module}.{a.name}" for a in node.names)


def import_graph() -> dict[str, set[str]]:
    """Product module -> the product modules it imports."""
    paths = {module_name(p): p for p in sources(*LAYERS)}
    return {
        name: {n for n in imported_names(p) if n in paths} - {name} for name, p in paths.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected part of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part: list[str] = []
            while not part or part[-1] != v:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def reached(graph: dict[str, set[str]], roots: set[str]) -> set[str]:
    """The modules `roots` import, directly or through others."""
    seen, todo = set(roots), list(roots)
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_no_import_circles() -> None:
    found = cycles(import_graph())
    assert not found, "\n".join(" <-> ".join(c) for c in found)


# the service's modules -> the one package of the engine they may reach
ENGINE_PARTS = {"gateway": "engine.text", "kvstore": "engine.kv_files"}


@pytest.mark.parametrize("service", list(ENGINE_PARTS))
def test_a_service_reaches_only_its_part_of_the_engine(service: str) -> None:
    graph, part = import_graph(), ENGINE_PARTS[service]
    roots = {m for m in graph if m.split(".")[0] == service}
    engine = {m for m in reached(graph, roots) if m.split(".")[0] == "engine"}
    wrong = sorted(m for m in engine if m != part and not m.startswith(f"{part}."))
    assert not wrong, f"{service} reaches {wrong}"


@pytest.mark.parametrize("service", list(ENGINE_PARTS))
def test_a_service_process_loads_only_its_part_of_the_engine(service: str) -> None:
    """What the process loads: every module of the service, its command, the command line;
    numba stands for the compute engine."""
    code = "\n".join(
        [
            "import importlib, pkgutil, sys",
            "import warmfleet.cli",
            f"importlib.import_module('warmfleet.commands.{service}')",
            f"for m in pkgutil.iter_modules(importlib.import_module('{service}').__path__):",
            f"    importlib.import_module('{service}.' + m.name)",
            "print(' '.join(m for m in sys.modules if m.split('.')[0] in ('engine', 'numba')))",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    part = ENGINE_PARTS[service]
    loaded = done.stdout.split()
    wrong = [m for m in loaded if m != "engine" and m != part and not m.startswith(f"{part}.")]
    assert not wrong, f"the {service} process loads {wrong}"


# ---- ARCHITECTURE.md: every module named, and only what exists ------------------------

MAP = REPO / "ARCHITECTURE.md"
TICKED = re.compile(r"`([^`]+)`")
ROW = re.compile(r"^\| [^|]* \| `([\w/]+/)` \|(.*)\|$")
PATH = re.compile(r"[\w/]+/|[\w/.]*\w\.(py|proto|c|cu|h|md|yaml|yml|toml|json|js|css|html)")


def folder_rows() -> dict[str, str]:
    """The layers table: folder (e.g. "engine/text/") -> its row's text."""
    return {m[1]: m[2] for line in MAP.read_text().splitlines() if (m := ROW.match(line))}


def test_every_product_module_is_named_in_the_map() -> None:
    """Each module by its path under the nearest folder the layers table has a row for
    (`validate.py`, or `commands/up.py` under `warmfleet/`); a package by its folder."""
    rows, missing = folder_rows(), []
    for path in sources(*LAYERS):
        rel = path.relative_to(REPO).as_posix()
        folder = max((f for f in rows if rel.startswith(f)), key=len, default=None)
        if folder is None:
            missing.append(f"{rel} (no row for its folder)")
            continue
        name = rel[len(folder) :]
        if name.endswith("__init__.py"):
            name = name.removesuffix("__init__.py")
            if not name:  # the row's own package
                continue
        if f"`{name}`" not in rows[folder]:
            missing.append(f"{rel} (not in the row of {folder})")
    assert not missing, "\n".join(missing)


def test_every_path_the_map_names_exists() -> None:
    """Paths in the layers table are under their row's folder (or the root); elsewhere
    under the root."""
    rows, wrong = folder_rows(), []
    named = [(folder, t) for folder, text in rows.items() for t in TICKED.findall(text)]
    rest = "\n".join(line for line in MAP.read_text().splitlines() if not ROW.match(line))
    named += [("", t) for t in TICKED.findall(rest) if "/" in t and not t.startswith("../")]
    for folder, token in named:
        if PATH.fullmatch(token) and not any((REPO / f / token).exists() for f in (folder, "")):
            wrong.append(f"{folder}{token}")
    assert not wrong, "\n".join(wrong)


def walk_steps() -> list[str]:
    """The numbered steps of "One Generate, through the files"."""
    text = MAP.read_text().split("## One Generate, through the files", 1)[1]
    return re.split(r"\n(?=\d+\. )", text.split("\n## ", 1)[0].strip())


def defined_names(path: Path) -> set[str]:
    """Classes, functions and methods (as `method` and `Class.method`) of a Python file;
    messages, services and their rpcs of a .proto file."""
    if path.suffix == ".proto":
        return set(re.findall(r"^\s*(?:message|service|rpc)\s+(\w+)", path.read_text(), re.M))
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names |= {item.name, f"{node.name}.{item.name}"}
    return names


def test_the_walk_names_functions_of_the_files_it_names() -> None:
    """Each `name` or `Class.method` of a step is defined in a file that step names."""
    wrong = []
    for step in walk_steps():
        ticked = TICKED.findall(step)
        files = [REPO / t for t in ticked if "/" in t and (REPO / t).is_file()]
        defined = set().union(*(defined_names(f) for f in files))
        for token in ticked:
            name = re.fullmatch(r"[A-Za-z_]\w*(\.\w+)?", token) and not PATH.fullmatch(token)
            if name and token not in defined:
                wrong.append(f"{token} (step {step.split('.', 1)[0]})")
    assert not wrong, "\n".join(wrong)
