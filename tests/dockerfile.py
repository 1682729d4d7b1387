"""deploy/Dockerfile read into its stages and instructions, for tests without a builder
(the plain forms the file uses: no heredocs, no JSON-form RUN, no parser directives)."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parent.parent / "deploy" / "Dockerfile"
RUN_FLAG = re.compile(r"^(?:--(?:mount|network|security)=\S+\s+)+")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (KEYWORD, arguments)

    def args_of(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def runs(self) -> list[str]:
        """The RUN commands as a shell gets them (RUN's own --mount flags left out)."""
        return [RUN_FLAG.sub("", args) for args in self.args_of("RUN")]

    def copies(self) -> list[tuple[list[str], str, str | None]]:
        """(sources, destination, --from stage or None) of each COPY."""
        found = []
        for args in self.args_of("COPY"):
            words = shlex.split(args)
            flags = dict(w[2:].split("=", 1) for w in words if w.startswith("--"))
            paths = [w for w in words if not w.startswith("--")]
            found.append((paths[:-1], paths[-1], flags.get("from")))
        return found

    def env(self) -> dict[str, str]:
        """ENV settings, values as written ($PATH and the like not expanded)."""
        found = {}
        for args in self.args_of("ENV"):
            for word in shlex.split(args, posix=False):
                key, _, value = word.partition("=")
                found[key] = value
        return found

    def entrypoint(self) -> list[str]:
        return list(json.loads(self.args_of("ENTRYPOINT")[-1]))

    def user(self) -> str:
        return self.args_of("USER")[-1]

    def workdir(self) -> str:
        return self.args_of("WORKDIR")[-1]


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each instruction; continuation lines joined, comments left out."""
    found = []
    pending = ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).strip().partition(" ")
        found.append((keyword.upper(), " ".join(args.split())))
        pending = ""
    return found


def stages(path: Path = DOCKERFILE) -> dict[str, Stage]:
    """Each named stage (FROM base AS name) with its instructions."""
    found: dict[str, Stage] = {}
    current: Stage | None = None
    for keyword, args in instructions(path):
        if keyword == "FROM":
            base, _, name = args.partition(" AS ")
            current = found[name.strip()] = Stage(name.strip(), base.strip())
        elif current is not None:
            current.instructions.append((keyword, args))
    return found


def build_args(path: Path = DOCKERFILE) -> dict[str, str]:
    """Global and stage ARG defaults (NAME=default)."""
    found = {}
    for keyword, args in instructions(path):
        if keyword == "ARG" and "=" in args:
            name, _, default = args.partition("=")
            found[name] = default
    return found
