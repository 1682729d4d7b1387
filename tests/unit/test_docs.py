"""The README and docs/ against the code they describe: every flag of every `warmfleet`
subcommand is in its section of docs/commands.md, every route of the gateway's HTTP app in
docs/http-api.md, every WARMFLEET_ environment variable the code names in docs/settings.md,
and none of them is documented after it is gone; every relative link in README.md and
docs/*.md names a file of the repository; the README stays short and starts with the two
commands. Fast: no process, no Redis."""

from __future__ import annotations

import argparse
import ast
import functools
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from starlette.routing import Mount, Route

from warmfleet.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
README = REPO / "README.md"
MAX_README_LINES = 160
MAX_README_TABLE_ROW = 120  # characters: a table cell is a line or two, never a page
# what the code is: everything but the tests, the docs and what tools make
NOT_CODE = {"tests", "docs", "__pycache__", "node_modules"}
ENV_VAR = re.compile(r"\bWARMFLEET_[A-Z0-9_]*[A-Z0-9]\b")
SECTION = re.compile(r"^## `warmfleet ([a-z][a-z ]*)`$", re.MULTILINE)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
PARAM = re.compile(r"\{[^}]*\}")  # a path parameter: {session_id:path}, {id}


def mentions(text: str, word: str) -> bool:
    """`word` in `text` as a whole word: `--max-queued` does not mention `--max`."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


# --- commands ---------------------------------------------------------------------------


@functools.cache
def subcommands() -> dict[str, argparse.ArgumentParser]:
    """'up', 'keys add', 'health grpc', ... -> the parser of that subcommand."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if path and not subs:
            found[" ".join(path)] = parser
        for action in subs:
            for name, sub in action.choices.items():
                walk(sub, [*path, name])

    walk(build_parser(), [])
    return found


@functools.cache
def command_sections() -> dict[str, str]:
    """docs/commands.md's "## `warmfleet NAME`" sections: NAME -> its text."""
    text = (DOCS / "commands.md").read_text()
    heads = list(SECTION.finditer(text))
    ends = [h.start() for h in heads[1:]] + [len(text)]
    return {h.group(1): text[h.end() : end] for h, end in zip(heads, ends, strict=True)}


def table_flags(section: str) -> set[str]:
    """The flags that open a row of the section's tables: | `--flag ARG` | ..."""
    return set(re.findall(r"^\| `(--[\w-]+)", section, re.MULTILINE))


def test_every_subcommand_has_its_section_and_no_section_outlives_its_subcommand() -> None:
    documented, parsed = set(command_sections()), set(subcommands())
    assert documented == parsed, (
        f"no section: {parsed - documented}; no such command: {documented - parsed}"
    )


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_flag_of_a_subcommand_has_its_row_in_its_section(name: str) -> None:
    """A row of the section's flag table (with the default beside it), not only a mention."""
    section = command_sections().get(name, "")
    rows = table_flags(section)
    for action in subcommands()[name]._actions:
        if isinstance(action, argparse._HelpAction):
            continue  # every subcommand has one; the page says so once
        if not action.option_strings:  # a positional: its metavar, as --help shows it
            shown = action.metavar if isinstance(action.metavar, str) else action.dest
            assert mentions(section, shown), f"warmfleet {name} {shown}: not in docs/commands.md"
        elif not rows & set(action.option_strings):
            flags = "/".join(action.option_strings)
            raise AssertionError(f"warmfleet {name} {flags}: no row in docs/commands.md")


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_flag_a_section_documents_exists(name: str) -> None:
    flags = {f for a in subcommands()[name]._actions for f in a.option_strings}
    gone = table_flags(command_sections().get(name, "")) - flags
    assert not gone, f"warmfleet {name} has no {gone}"


def test_the_flags_of_warmfleet_itself_are_on_the_page() -> None:
    text = (DOCS / "commands.md").read_text()
    for action in build_parser()._actions:
        for flag in action.option_strings:
            assert mentions(text, flag), flag


# --- HTTP routes ------------------------------------------------------------------------


@functools.cache
def http_routes() -> list[tuple[str, str]]:
    """(method, path) of every route the gateway's HTTP app serves; path parameters as {}
    and a mounted folder as PATH/... (the app is built without Redis: nothing runs)."""
    from gateway.http_app import build_app

    stub = SimpleNamespace(core=SimpleNamespace(metrics=None))  # what building reads
    app = build_app(stub, None)  # type: ignore[arg-type]
    while not hasattr(app, "routes"):  # the middleware around the Starlette app
        app = app.app  # type: ignore[attr-defined]
    found = []
    for route in app.routes:
        if isinstance(route, Route):
            methods = sorted(set(route.methods or ()) - {"HEAD"})  # HEAD comes with GET
            found += [(method, PARAM.sub("{}", route.path)) for method in methods]
        elif isinstance(route, Mount):
            found.append(("GET", f"{route.path}/..."))
        else:
            raise AssertionError(f"a route of a kind this test does not know: {route!r}")
    return found


def documented_routes() -> list[tuple[str, str]]:
    """(method, path) of the routes docs/http-api.md names as `METHOD /path`."""
    text = (DOCS / "http-api.md").read_text()
    named = re.findall(r"`(GET|POST|PUT|PATCH|DELETE) (/[^`\s?]*)", text)
    return [(method, PARAM.sub("{}", path)) for method, path in named]


def test_the_app_has_routes() -> None:  # else the next test would pass on nothing
    assert ("POST", "/v1/chat/completions") in http_routes()


@pytest.mark.parametrize("method_path", http_routes(), ids=" ".join)
def test_every_route_is_in_the_http_api_page(method_path: tuple[str, str]) -> None:
    assert method_path in documented_routes(), f"{' '.join(method_path)}: not in docs/http-api.md"


def test_every_route_the_page_names_is_served() -> None:
    gone = set(documented_routes()) - set(http_routes())
    assert not gone, f"docs/http-api.md names routes the app does not serve: {gone}"


# --- environment variables --------------------------------------------------------------


def skipped(folder: str) -> bool:
    return folder in NOT_CODE or folder.startswith(".") or folder.endswith(".egg-info")


def code_files() -> list[Path]:
    """Python files, and every file of deploy/, and ./dev; not in tests/, docs/, .venv/..."""
    files = []
    for folder, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if not skipped(d)]
        for name in names:
            path = Path(folder, name)
            parts = path.relative_to(REPO).parts
            if path.suffix == ".py" or parts[0] == "deploy" or parts == ("dev",):
                files.append(path)
    return files


@functools.cache
def environment_variables() -> dict[str, str]:
    """WARMFLEET_* named in the code: a Python file's strings, or any text of deploy/ and
    ./dev -> the first file that names it."""
    found: dict[str, str] = {}
    for path in code_files():
        if path.suffix == ".py":
            nodes = ast.walk(ast.parse(path.read_text(), str(path)))
            texts = [
                n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)
            ]
        else:
            try:
                texts = [path.read_text()]
            except UnicodeDecodeError:
                continue
        for name in (v for t in texts for v in ENV_VAR.findall(t)):
            found.setdefault(name, str(path.relative_to(REPO)))
    return found


def test_the_code_names_environment_variables() -> None:  # else the next would pass on none
    assert {"WARMFLEET_REDIS_URL", "WARMFLEET_MODEL_DIR"} <= set(environment_variables())


@pytest.mark.parametrize("name", sorted(environment_variables()))
def test_every_environment_variable_is_in_the_settings_page(name: str) -> None:
    where = environment_variables()[name]
    assert mentions((DOCS / "settings.md").read_text(), name), f"{name} ({where})"


def test_every_variable_the_settings_page_names_is_in_the_code() -> None:
    documented = set(ENV_VAR.findall((DOCS / "settings.md").read_text()))
    gone = documented - set(environment_variables())
    assert not gone, f"docs/settings.md names variables no code reads: {gone}"


# --- links and the README ---------------------------------------------------------------


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def links(page: Path) -> list[str]:
    """The relative link targets of a markdown page, code blocks left out."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_every_relative_link_names_a_file_of_the_repository(page: Path) -> None:
    for target in links(page):
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(REPO), f"{page.name}: {target} leaves the repository"
        assert path.exists(), f"{page.name}: {target} does not exist"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(REPO / t.split("#")[0]).resolve() for t in links(README)}
    assert set(DOCS.glob("*.md")) <= linked, set(DOCS.glob("*.md")) - linked


def test_the_readme_is_short_and_its_tables_cells_too() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md: {len(lines)} lines"
    rows = [row for row in lines if row.startswith("|")]
    assert all(len(row) <= MAX_README_TABLE_ROW for row in rows), max(rows, key=len)


def test_the_readme_starts_with_the_two_commands_ci_runs() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), re.DOTALL)
    assert first_block is not None and first_block.start() < 40, "not at the README's top"
    commands = [line.split("#")[0].split() for line in first_block.group(1).splitlines()]
    assert commands == [["./dev", "up"], ["./dev", "test"]], first_block.group(1)
    assert "./dev test" in (REPO / ".ci" / "run").read_text()
