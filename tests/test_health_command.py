"""`warmfleet health`, the compose healthchecks: exit 0 for a healthy part, 1 (the reason on
stderr) for one that is not or does not answer in time, 2 for bad arguments. Against gRPC
health servers and a real Redis, and end to end against a cluster of the tiny model."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest
import redis as redis_lib
from grpc_health.v1 import health_pb2

from broker.keys import draining_key, heartbeat_key
from common.grpc_serve import serve
from tests.cluster_fixtures import redis_client, redis_server  # noqa: F401
from tests.tiny_gguf import write_tiny_llama
from warmfleet.cli import main
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.processes import free_port
from warmfleet.redis_server import RedisServer


def health(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`warmfleet health ARGS` in this process: exit code, stdout, stderr."""
    try:
        code = main(["health", *args])
    except SystemExit as e:  # argparse's usage errors
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose listener accepts connections but never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]


def test_a_serving_server_is_healthy_and_one_not_serving_is_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    server, port, health_servicer = serve([], "127.0.0.1:0", 2)
    try:
        assert health(capsys, "grpc", f"127.0.0.1:{port}")[:2] == (
            0, f"127.0.0.1:{port} (service ''): SERVING\n"
        )  # fmt: skip
        health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        code, out, err = health(capsys, "grpc", f"127.0.0.1:{port}")
        assert (code, out) == (1, "") and err.strip().endswith("health: NOT_SERVING")
        code, _, err = health(capsys, "grpc", f"127.0.0.1:{port}", "--service", "nope")
        assert code == 1 and "NOT_FOUND" in err and "'nope'" in err
    finally:
        server.stop(None)


def test_a_closed_port_is_unhealthy(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = health(capsys, "grpc", f"127.0.0.1:{free_port()}", "--timeout", "2")
    assert (code, out) == (1, "")
    assert err.startswith("warmfleet health: ") and "UNAVAILABLE" in err
    assert len(err.splitlines()) == 1


def test_a_server_that_never_answers_is_unhealthy_at_the_deadline(
    capsys: pytest.CaptureFixture[str], silent_port: int
) -> None:
    code, _, err = health(capsys, "grpc", f"127.0.0.1:{silent_port}", "--timeout", "0.3")
    assert code == 1 and "DEADLINE_EXCEEDED" in err


def test_a_worker_with_a_heartbeat_is_healthy_draining_or_not(
    capsys: pytest.CaptureFixture[str],
    redis: redis_lib.Redis,
    redis_server: RedisServer,  # noqa: F811
) -> None:
    redis.set(heartbeat_key("w-live"), json.dumps({"num_running": 3}), px=5000)
    code, out, _ = health(
        capsys, "worker", "--worker-id", "w-live", "--redis-url", redis_server.url
    )
    assert code == 0 and "taking requests, 3 running" in out
    redis.set(draining_key("w-live"), "1")
    code, out, _ = health(
        capsys, "worker", "--worker-id", "w-live", "--redis-url", redis_server.url
    )
    assert code == 0 and "draining" in out


def test_a_worker_without_a_heartbeat_is_unhealthy(
    capsys: pytest.CaptureFixture[str],
    redis: redis_lib.Redis,
    redis_server: RedisServer,  # noqa: F811
) -> None:
    redis.set(heartbeat_key("w-gone"), "{}", px=1)  # its TTL runs out
    time.sleep(0.05)
    for worker_id in ("w-gone", "w-never"):
        code, out, err = health(
            capsys, "worker", "--worker-id", worker_id, "--redis-url", redis_server.url
        )
        assert (code, out) == (1, "") and f"worker {worker_id}: no heartbeat" in err


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:{free}/0", "redis://127.0.0.1:{silent}/0"], ids=["closed", "mute"]
)
def test_a_redis_out_of_reach_is_unhealthy_within_the_timeout(
    capsys: pytest.CaptureFixture[str], silent_port: int, url: str
) -> None:
    url = url.format(free=free_port(), silent=silent_port)
    code, _, err = health(capsys, "worker", "--worker-id", "w0", "--redis-url", url,
                          "--timeout", "0.3")  # fmt: skip
    assert code == 1 and "cannot read Redis" in err


@pytest.mark.parametrize(
    "args",
    [["grpc", "no-port"], ["grpc", "host:0"], ["grpc", "h:1", "--timeout", "0"],
     ["grpc", "h:1", "--timeout", "soon"], ["worker"], [], ["http", "h:1"]],
)  # fmt: skip
def test_bad_arguments_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    code, out, err = health(capsys, *args)
    assert (code, out) == (2, "") and len(err.splitlines()) == 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("health")
    config = ClusterConfig(
        num_workers=1,
        model=write_tiny_llama(tmp / "tiny.gguf"),
        lease_s=1.0,
        spill_dir=tmp / "spill",
        log_dir=tmp / "logs",
        progress=lambda _: None,
    )
    with Cluster(config) as c:
        yield c


@pytest.mark.slow
def test_every_part_of_a_running_cluster_is_healthy_until_its_worker_dies(
    capsys: pytest.CaptureFixture[str], cluster: Cluster
) -> None:
    (worker_id,) = cluster.worker_ids
    worker = ["worker", "--worker-id", worker_id, "--redis-url", cluster.redis_url]
    assert health(capsys, "grpc", cluster.target)[0] == 0
    assert health(capsys, "grpc", cluster.target, "--service", "warmfleet.v1.Inference")[0] == 0
    assert (
        health(capsys, "grpc", cluster.kvstore_target, "--service", "warmfleet.v1.KVStore")[0] == 0
    )
    assert health(capsys, *worker)[0] == 0
    assert health(capsys, *worker[:2], "nobody", *worker[3:])[0] == 1
    cluster.kill(worker_id)
    deadline = time.monotonic() + 30
    while health(capsys, *worker)[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)  # the heartbeat outlives the worker by its TTL (the lease)
    code, _, err = health(capsys, *worker)
    assert code == 1 and "no heartbeat" in err
    while health(capsys, "grpc", cluster.target)[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)  # the gateway reads heartbeats every 0.25 s
    code, _, err = health(capsys, "grpc", cluster.target)
    assert code == 1 and "NOT_SERVING" in err  # no worker: the gateway says so
    assert health(capsys, "grpc", cluster.kvstore_target)[0] == 0
