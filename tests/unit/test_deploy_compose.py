"""deploy/'s compose files, checked without a Docker engine: each file and each variant
(CPU: compose.yaml; GPU: compose.yaml + compose.gpu.yaml) against the Compose
Specification's schema (tests/fixtures/compose-spec.json, pinned), then what a schema cannot
see: every warmfleet command and healthcheck parses with the real CLI, and the ports,
volumes, Prometheus targets, GPU reservations and dependencies agree with each other."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests import dockerfile
from tests.compose_files import (
    DEPLOY,
    VARIANTS,
    Port,
    Volume,
    active_services,
    argv,
    commented_settings,
    env_settings,
    load,
    referenced_variables,
    runs_warmfleet,
    variant,
)
from warmfleet.cli import build_parser
from warmfleet.commands.health import DEFAULT_TIMEOUT_S

SCHEMA = Path(__file__).parents[1] / "fixtures" / "compose-spec.json"
SCHEMA_NOTE = SCHEMA.with_suffix(".md")  # where it comes from, its version and sha256
PYTHON_START_S = 2.0  # a healthcheck's `warmfleet` imports its CLI before it asks


def parse(args: list[str], where: str) -> Any:
    """`warmfleet ARGS` parsed by the real CLI; a usage error fails the test, naming `where`."""
    try:
        return build_parser().parse_args(args)
    except SystemExit as e:
        pytest.fail(f"{where}: `warmfleet {' '.join(args)}` does not parse (exit {e.code})")


def parsed_commands(variant_name: str) -> dict[str, Any]:
    """Each active warmfleet service's command, parsed."""
    services = active_services(variant(variant_name))
    return {n: parse(argv(s), n) for n, s in services.items() if runs_warmfleet(s)}


def workers(variant_name: str) -> dict[str, Any]:
    return {n: a for n, a in parsed_commands(variant_name).items() if a.command == "worker"}


def mounts(service: dict[str, Any]) -> dict[str, Volume]:
    """The service's volumes by their target path."""
    return {v.target: v for v in map(Volume.parse, service.get("volumes", []))}


def test_the_schema_is_the_pinned_file() -> None:
    pinned = re.search(r"sha256: ([0-9a-f]{64})", SCHEMA_NOTE.read_text())
    assert pinned and hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == pinned[1]


FILES = sorted({f for files in VARIANTS.values() for f in files})


@pytest.mark.parametrize("name", FILES + list(VARIANTS))
def test_each_file_and_each_variant_validates_against_the_compose_schema(name: str) -> None:
    schema = json.loads(SCHEMA.read_text())
    model = variant(name) if name in VARIANTS else load(name, env_settings())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(model)]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_warmfleet_command_is_a_subcommand_whose_arguments_parse(name: str) -> None:
    commands = parsed_commands(name)
    assert {a.command for a in commands.values()} == {"model", "kvstore", "worker", "gateway"}
    for service, args in commands.items():
        if args.command in ("kvstore", "gateway"):
            assert args.host == "0.0.0.0", f"{service}: out of other containers' reach"
        if args.command in ("kvstore", "worker"):
            assert args.metrics_host == "0.0.0.0", f"{service}: out of Prometheus's reach"


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_long_running_service_has_a_healthcheck_that_asks_it(name: str) -> None:
    services = active_services(variant(name))
    commands = parsed_commands(name)
    for service_name, service in services.items():
        if service.get("restart") == "no":  # one-shot: others wait for it to complete
            assert "healthcheck" not in service
            continue
        check = service["healthcheck"]
        assert check["test"][0] in ("CMD", "CMD-SHELL"), service_name
        if not runs_warmfleet(service):
            continue
        assert check["test"][:3] == ["CMD", "warmfleet", "health"], service_name
        health = parse(check["test"][2:], f"{service_name} healthcheck")
        own = commands[service_name]
        if own.command == "worker":
            assert (health.health_command, health.worker_id) == ("worker", own.worker_id)
        else:  # the part's own gRPC port, from inside its container
            assert health.health_command == "grpc", service_name
            assert health.target == f"127.0.0.1:{own.port}", service_name
        assert health.timeout == DEFAULT_TIMEOUT_S
        assert health.timeout + PYTHON_START_S <= seconds(check["timeout"]), service_name


def seconds(duration: str) -> float:
    """A Compose duration such as 10s, 1m or 1m30s."""
    units = {"h": 3600, "m": 60, "s": 1}
    total, number = 0.0, ""
    for ch in duration:
        if ch.isdigit() or ch == ".":
            number += ch
        else:
            total, number = total + float(number) * units[ch], ""
    return total


def test_prometheus_scrapes_each_part_where_it_serves_metrics() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"]
               for t in sc["targets"]}  # fmt: skip
    commands = parsed_commands("cpu")
    served = {f"{n}:{a.metrics_port}" for n, a in commands.items() if a.command != "gateway"
              and getattr(a, "metrics_port", 0)}  # fmt: skip
    served |= {f"{n}:{a.http_port}" for n, a in commands.items() if a.command == "gateway"}
    assert targets == served


def test_the_gateway_publishes_its_grpc_and_http_ports_as_env_example_says() -> None:
    env = env_settings()
    gateway = variant("gpu")["services"]["gateway"]
    args = parse(argv(gateway), "gateway")
    published = {p.target: p for p in map(Port.parse, gateway["ports"])}
    assert published[args.port].published == env["GATEWAY_GRPC_PORT"]
    assert published[args.http_port].published == env["GATEWAY_HTTP_PORT"]
    assert {p.host_ip for p in published.values()} == {env["PUBLISH_ADDRESS"]}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_volumes_are_declared_and_the_parts_agree_on_their_paths(name: str) -> None:
    model = variant(name)
    services = active_services(model)
    for service_name, service in services.items():
        for volume in mounts(service).values():
            if volume.named:
                assert volume.source in model["volumes"], f"{service_name}: {volume.source}"
            else:
                assert (DEPLOY / volume.source).exists(), f"{service_name}: {volume.source}"
    spill = {}
    for service_name, args in parsed_commands(name).items():
        own = mounts(services[service_name])
        if args.command in ("worker", "kvstore"):  # one spill folder, the same path in each
            spill[service_name] = own[args.spill_dir].source
        if args.command in ("worker", "gateway"):
            folder = str(Path(args.model).parent)
            assert own[folder].source == "models" and own[folder].read_only, service_name
    assert set(spill.values()) == {"spill"}, spill
    assert mounts(services["model"])["/var/lib/warmfleet/models"] == Volume(
        "models", "/var/lib/warmfleet/models", False
    )


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_image_s_folders_are_the_volumes_mount_points(name: str) -> None:
    services = active_services(variant(name))
    folders = {"model": ["WARMFLEET_MODEL_DIR"], "kvstore": ["WARMFLEET_SPILL_DIR"],
               "worker": ["WARMFLEET_SPILL_DIR", "WARMFLEET_KERNEL_DIR"]}  # fmt: skip
    for service_name, service in services.items():
        if not runs_warmfleet(service):
            continue
        stage = dockerfile.stages()[service["build"]["target"]]
        assert service["image"] == f"warmfleet:{stage.name}", service_name
        assert stage.entrypoint() == ["warmfleet"] and stage.user() not in ("root", "0")
        env, own = stage.env(), mounts(service)
        for setting in folders.get(argv(service)[0], []):
            assert own[env[setting]].named, f"{service_name}: {setting} is not on a volume"
        args = parse(argv(service), service_name)
        if hasattr(args, "spill_dir"):
            assert args.spill_dir == env["WARMFLEET_SPILL_DIR"], service_name


def gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    resources = service.get("deploy", {}).get("resources", {})
    return list(resources.get("reservations", {}).get("devices", []))


def test_the_gpu_variant_reserves_the_gpu_for_each_worker_and_the_cpu_one_none() -> None:
    for service_name, service in variant("gpu")["services"].items():
        args = parse(argv(service), service_name) if runs_warmfleet(service) else None
        if args is not None and args.command == "worker":
            # float32: the weights stay quantized (the CUDA kernels)
            expected = ("cuda", "float32", "auto")
            assert (args.device, args.dtype, args.weights) == expected, service_name
            assert gpu_devices(service) == [
                {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
            ], service_name
        else:
            assert not gpu_devices(service), service_name
    for service_name, service in variant("cpu")["services"].items():
        assert not gpu_devices(service), service_name
        assert service.get("build", {}).get("target", "cpu") == "cpu", service_name
    assert all(a.device == "cpu" for a in workers("cpu").values())


def test_a_gpu_worker_differs_from_its_cpu_self_only_in_where_and_how_much() -> None:
    cpu, gpu = workers("cpu"), workers("gpu")
    assert list(gpu) == ["worker-0"]  # worker-1 waits for its profile (compose.gpu.yaml)
    both = active_services(variant("gpu"), {"second-worker"})
    assert [n for n in both if n.startswith("worker-")] == ["worker-0", "worker-1"]
    differ = {"device", "dtype", "threads", "warm_budget"}
    for name, gpu_args in gpu.items():
        cpu_args = vars(cpu[name])
        same = {k: v for k, v in vars(gpu_args).items() if k not in differ}
        assert same == {k: v for k, v in cpu_args.items() if k not in differ}, name


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_dependency_exists_and_waits_for_the_right_condition(name: str) -> None:
    services = active_services(variant(name))
    for service_name, service in services.items():
        for target, how in service.get("depends_on", {}).items():
            assert target in services, f"{service_name} depends on {target}: not started"
            other = services[target]
            if how["condition"] == "service_healthy":
                assert "healthcheck" in other, f"{service_name}: {target} has no healthcheck"
            else:
                assert how["condition"] == "service_completed_successfully", service_name
                assert other.get("restart") == "no", f"{target} is not a one-shot service"
    commands = parsed_commands(name)
    for service_name, args in commands.items():
        if args.command in ("worker", "gateway"):  # they load the model the model service pulls
            assert services[service_name]["depends_on"]["model"]["condition"] == (
                "service_completed_successfully"
            )


def test_env_example_documents_every_setting_the_compose_files_read() -> None:
    documented = set(env_settings()) | commented_settings()
    used = set().union(*(referenced_variables(DEPLOY / f) for f in VARIANTS["gpu"]))
    assert used - documented == set()
    assert documented - used == {"COMPOSE_FILE", "COMPOSE_PROFILES"}
    assert env_settings()["COMPOSE_FILE"].split(":") == VARIANTS["gpu"]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_without_an_env_file_the_defaults_are_env_example_s_values(name: str) -> None:
    """`docker compose -f compose.yaml up` with no .env runs what .env.example describes."""
    assert variant(name, env={}) == variant(name)


def test_prometheus_and_grafana_find_their_configs_and_each_other() -> None:
    services = variant("gpu")["services"]
    prometheus, grafana = mounts(services["prometheus"]), mounts(services["grafana"])
    assert prometheus["/etc/prometheus/prometheus.yml"].source == "./prometheus.yml"
    assert grafana["/etc/grafana/provisioning"].source == "./grafana/provisioning"
    provisioning = DEPLOY / "grafana" / "provisioning"
    dashboards = yaml.safe_load((provisioning / "dashboards" / "warmfleet.yaml").read_text())
    folder = dashboards["providers"][0]["options"]["path"]
    assert grafana[f"{folder}/warmfleet-dashboard.json"].source == (
        "./grafana/warmfleet-dashboard.json"
    )
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    url = datasource["datasources"][0]["url"]
    ports = [Port.parse(p).target for p in services["prometheus"]["ports"]]
    assert url == f"http://prometheus:{ports[0]}"
