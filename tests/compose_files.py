"""deploy/'s compose files as Compose reads them, for tests without a Docker engine: each
file's YAML (anchors resolved) interpolated with .env.example's settings, then the GPU
override merged by the Compose Specification's merge rules (13-merge.md) for the keys the
files use."""

from __future__ import annotations

import copy
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml  # PyYAML: a dependency of gguf

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
ENV_EXAMPLE = DEPLOY / ".env.example"
VARIANTS = {"cpu": ["compose.yaml"], "gpu": ["compose.yaml", "compose.gpu.yaml"]}
WARMFLEET_IMAGE = re.compile(r"^warmfleet:")
# $$, ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}, $NAME
VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>\w+)(?:(?P<op>:?[-?])(?P<arg>[^${}]*))?\}|(?P<bare>\w+))"
)
REPLACED = {"command", "entrypoint"}  # sequences an override replaces whole (13-merge.md)
UNIQUE_BY = {"volumes": "target", "ports": "port"}  # sequences merged by their unique key


def env_settings(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """KEY=VALUE lines of an env file (comments and blank lines skipped; no quoting used)."""
    found = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
            found[key.strip()] = value.strip()
    return found


def commented_settings(path: Path = ENV_EXAMPLE) -> set[str]:
    """Settings an env file documents but leaves commented out ("# NAME=value")."""
    return set(re.findall(r"^# ?([A-Z][A-Z0-9_]*)=", path.read_text(), re.MULTILINE))


def referenced_variables(path: Path) -> set[str]:
    """The variables a compose file interpolates."""
    return {
        m["braced"] or m["bare"] for m in VARIABLE.finditer(path.read_text()) if not m["escaped"]
    }


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """`value` with every string interpolated as Compose does (12-interpolation.md)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value
    if "${" in VARIABLE.sub("", value):
        raise ValueError(f"interpolation this helper does not know: {value!r}")
    return VARIABLE.sub(lambda m: _substitute(m, env), value)


def _substitute(m: re.Match[str], env: dict[str, str]) -> str:
    if m["escaped"]:
        return "$"
    name = m["braced"] or m["bare"]
    op, arg = m["op"], m["arg"] or ""
    unset, empty = name not in env, not env.get(name)
    if op in (":-", "-") and (empty if op == ":-" else unset):
        return arg
    if op in (":?", "?") and (empty if op == ":?" else unset):
        raise ValueError(f"${{{name}}} is required: {arg}")
    return env.get(name, "")


def load(name: str, env: dict[str, str]) -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / name).read_text())
    assert isinstance(data, dict), name
    return dict(interpolate(data, env))


def merge(base: Any, override: Any, key: str = "") -> Any:
    """`override` merged into `base`: mappings key by key, `command`, `entrypoint` and
    healthcheck `test` replaced, volumes and ports by their unique key, other sequences
    appended, scalars replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for k, v in override.items():
            merged[k] = merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return merged
    if isinstance(base, list) and isinstance(override, list) and key not in REPLACED | {"test"}:
        if key in UNIQUE_BY:
            by_key = {_unique_key(key, e): e for e in base}
            by_key.update({_unique_key(key, e): e for e in override})
            return list(by_key.values())
        return base + override
    return copy.deepcopy(override)


def _unique_key(kind: str, entry: Any) -> Any:
    if kind == "volumes":
        return Volume.parse(entry).target
    return Port.parse(entry)


def variant(name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The compose model of a variant ("cpu" or "gpu") with .env.example's settings."""
    env = env_settings() if env is None else env
    files = [load(f, env) for f in VARIANTS[name]]
    model = files[0]
    for override in files[1:]:
        model = merge(model, override)
    return model


def active_services(model: dict[str, Any], profiles: set[str] | None = None) -> dict[str, Any]:
    """Services `docker compose up` starts: those with no profile or an enabled one."""
    if profiles is None:
        profiles = {p for p in env_settings().get("COMPOSE_PROFILES", "").split(",") if p}
    services: dict[str, Any] = model["services"]
    return {n: s for n, s in services.items() if not set(s.get("profiles", [])) - profiles}


def runs_warmfleet(service: dict[str, Any]) -> bool:
    """The service runs our image, whose entrypoint is `warmfleet`."""
    return bool(WARMFLEET_IMAGE.match(service.get("image", "")))


def argv(service: dict[str, Any]) -> list[str]:
    """The service's command as a list (a string command is split as Compose splits it)."""
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


@dataclass(frozen=True)
class Volume:
    source: str
    target: str
    read_only: bool

    @staticmethod
    def parse(spec: str | dict[str, Any]) -> Volume:
        if isinstance(spec, dict):
            return Volume(spec.get("source", ""), spec["target"], bool(spec.get("read_only")))
        source, target, *mode = spec.split(":")
        return Volume(source, target, mode == ["ro"])

    @property
    def named(self) -> bool:
        return not self.source.startswith((".", "/", "~"))


@dataclass(frozen=True)
class Port:
    host_ip: str
    published: str
    target: int

    @staticmethod
    def parse(spec: str | int | dict[str, Any]) -> Port:
        if isinstance(spec, dict):
            return Port(spec.get("host_ip", ""), str(spec.get("published", "")), spec["target"])
        parts = str(spec).split("/")[0].split(":")  # [[HOST_IP:]PUBLISHED:]TARGET[/PROTOCOL]
        host_ip, published, target = ["", "", *parts][-3:]
        return Port(host_ip, published, int(target))
