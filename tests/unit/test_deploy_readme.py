"""docs/deploy.md against the compose files it describes: every command it gives runs a real
subcommand in a real service, every address it gives is a port that service publishes, every
file it names exists; the README's short version gives only the page's steps (files only; no
Docker engine)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.compose_files import (
    DEPLOY,
    REPO,
    Port,
    Volume,
    active_services,
    argv,
    env_settings,
    variant,
)
from warmfleet.cli import build_parser

PAGE = "docs/deploy.md"
README_SECTION = "## Deploy on a GB10"
URL = re.compile(r"http://BOX:(\d+)(/[\w/.-]*)?")
# the .env setting of each port an address may name, and the service that publishes it
PORT_OWNERS = {"GATEWAY_HTTP_PORT": "gateway", "GRAFANA_PORT": "grafana",
               "PROMETHEUS_PORT": "prometheus"}  # fmt: skip
MADE_BY_THE_STEPS = {"deploy/.env"}  # cp .env.example .env


def section() -> str:
    return (REPO / PAGE).read_text()


def readme_section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(f"\n{README_SECTION}\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def shell_lines(text: str | None = None) -> list[str]:
    """The lines of the ```sh blocks (the page's by default), comments off."""
    blocks = re.findall(r"```sh\n(.*?)```", section() if text is None else text, re.DOTALL)
    return [line.split("#")[0].strip() for b in blocks for line in b.splitlines() if line.strip()]


def published() -> dict[int, tuple[str, int]]:
    """Host port -> (service, container port), GPU variant, .env.example's settings."""
    found = {}
    for name, service in active_services(variant("gpu")).items():
        for port in map(Port.parse, service.get("ports", [])):
            found[int(port.published)] = (name, port.target)
    return found


def test_the_section_steps_start_in_deploy_with_the_env_file_and_one_up() -> None:
    lines = shell_lines()
    assert "cd warmfleet/deploy" in lines
    assert "cp .env.example .env" in lines and (DEPLOY / ".env.example").is_file()
    assert "docker compose up -d" in lines  # COMPOSE_FILE in .env picks the files
    for update in ("git pull", "docker compose build", "docker compose up -d"):
        assert update in lines


def test_every_exec_runs_a_subcommand_that_parses_in_a_service_that_runs_warmfleet() -> None:
    services = active_services(variant("gpu"))
    execs = [shlex.split(line) for line in shell_lines() if line.startswith("docker compose exec")]
    inline = re.findall(r"`(docker compose exec [^`]+)`", section())
    execs += [shlex.split(line) for line in inline]
    assert len(execs) >= 3
    for words in execs:
        service, program, *args = words[3:]
        assert service in services and program == "warmfleet", words
        parsed = build_parser().parse_args(args)  # a usage error exits: the test fails
        if parsed.command == "keys":
            targets = {Volume.parse(v).target for v in services[service]["volumes"]}
            assert Path(parsed.file).parent.as_posix() in targets, "the key file is on no volume"


def test_the_key_file_the_steps_make_is_the_one_env_example_names() -> None:
    made = {shlex.split(line)[shlex.split(line).index("--file") + 1] for line in shell_lines()
            if " keys add " in line}  # fmt: skip
    (key_file,) = made
    assert f"KEYS_FILE={key_file}" in section()
    assert f"KEYS_FILE={key_file}" in (DEPLOY / ".env.example").read_text()
    assert "KEYS_FILE" in env_settings()


@pytest.mark.parametrize("port_and_path", sorted(set(URL.findall(section()))))
def test_every_address_is_a_port_its_service_publishes(port_and_path: tuple[str, str]) -> None:
    port, path = int(port_and_path[0]), port_and_path[1] or ""
    ports = published()
    assert port in ports, f"http://BOX:{port}{path}: no service publishes {port}"
    service, target = ports[port]
    env = env_settings()
    assert {int(env[k]): v for k, v in PORT_OWNERS.items()}[port] == service
    if service == "gateway":  # its HTTP face: the APIs, /dashboard, /metrics
        gateway = build_parser().parse_args(argv(variant("gpu")["services"]["gateway"]))
        assert target == gateway.http_port


def test_the_grpc_target_is_the_gateway_s_published_grpc_port() -> None:
    (target,) = re.findall(r"warmfleet chat --target BOX:(\d+)", section())
    gateway = build_parser().parse_args(argv(variant("gpu")["services"]["gateway"]))
    assert published()[int(target)] == ("gateway", gateway.port)
    build_parser().parse_args(["chat", "--target", f"box:{target}", "--session", "me"])


def test_the_services_and_files_it_names_exist() -> None:
    services = variant("gpu")["services"]
    named = set(re.findall(r"`([a-z][a-z0-9-]*)`", section()))
    for name in ("model", "redis", "kvstore", "worker-0", "gateway"):
        assert name in named and name in services, name
    for path in set(re.findall(r"`(deploy/[\w./-]+)`", section())) - MADE_BY_THE_STEPS:
        assert (REPO / path).exists(), path


def test_each_named_address_is_that_service_s_port() -> None:
    owners = {"the dashboard": "gateway", "Grafana": "grafana", "Prometheus": "prometheus"}
    named = re.findall(r"(the dashboard|Grafana|Prometheus): http://BOX:(\d+)", section())
    assert {what for what, _ in named} == set(owners)
    for what, port in named:
        assert published()[int(port)][0] == owners[what], what


def test_the_readme_s_short_version_gives_the_page_s_steps_and_links_it() -> None:
    readme = readme_section()
    lines = shell_lines(readme)
    assert "docker compose up -d" in lines
    assert set(lines) <= set(shell_lines()), set(lines) - set(shell_lines())
    assert f"]({PAGE})" in readme
