"""Cluster: start, readiness, failures and stop order, with stand-in worker and gateway processes.

The stand-ins (tests/fake_cluster.py) take the real commands' arguments, keep a heartbeat and
answer the health check; the real worker and gateway are covered by the cluster tests.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import pytest
import redis as redis_lib

from broker.keys import heartbeat_key
from common.errors import ServiceError
from tests.cluster_fixtures import redis_client, redis_server  # noqa: F401
from tests.fake_cluster import CLI_MODULE, child_env
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.probes import HealthProbe
from warmfleet.processes import free_port
from warmfleet.redis_server import RedisServer


def make_cluster(tmp_path: Path, **kwargs: object) -> Cluster:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    env = child_env(**kwargs.pop("extra_env", {}))  # type: ignore[arg-type]
    options: dict = {
        "num_workers": 2,
        "threads_per_worker": 1,
        "model": model,
        "progress": lambda _: None,
    }
    options.update(kwargs)
    return Cluster(
        ClusterConfig(
            extra_env=env,
            log_dir=tmp_path / "logs",
            cli_module=CLI_MODULE,
            **options,
        )
    )


def logged_argv(cluster: Cluster, name: str) -> list[str]:
    match = re.search(r"argv (\[.*\])", cluster.log_path(name).read_text())
    assert match, cluster.log_path(name).read_text()
    return json.loads(match.group(1))


def stopped_at(cluster: Cluster, name: str) -> float:
    match = re.search(r"stopped at ([0-9.]+)", cluster.log_path(name).read_text())
    assert match, cluster.log_path(name).read_text()
    return float(match.group(1))


def test_starts_every_part_then_stops_gateway_first(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, lease_s=5.0)
    with cluster:
        client = redis_lib.Redis.from_url(cluster.redis_url, socket_timeout=5.0)
        assert all(client.exists(heartbeat_key(w)) for w in ["w0", "w1"])
        client.close()
        probe = HealthProbe(cluster.target)
        assert probe.not_serving_reason() is None
        probe.close()
        assert cluster.worker_ids == ["w0", "w1"]
        assert set(cluster.processes) == {"redis", "kvstore", "w0", "w1", "gateway"}
        w1 = logged_argv(cluster, "w1")
        assert w1[w1.index("--worker-id") + 1] == "w1"
        assert w1[w1.index("--redis-url") + 1] == cluster.redis_url
        assert w1[w1.index("--threads") + 1] == "1"
        assert w1[w1.index("--lease-s") + 1] == "5.0"
        assert w1[w1.index("--model") + 1] == str(tmp_path / "model.gguf")
        gateway = logged_argv(cluster, "gateway")
        assert gateway[gateway.index("--port") + 1] == str(cluster.port)
        kvstore = logged_argv(cluster, "kvstore")
        assert kvstore[kvstore.index("--port") + 1] == str(cluster.kvstore_port)
        ports = {
            name: int(argv[argv.index("--metrics-port") + 1])
            for name, argv in (("w1", w1), ("kvstore", kvstore))
        }
        assert ports == {
            "w1": cluster.metrics_ports["w1"],
            "kvstore": cluster.metrics_ports["kvstore"],
        }
        assert len(set(cluster.metrics_ports.values())) == 3  # kvstore, w0, w1: each its own
        assert HealthProbe(cluster.kvstore_target).not_serving_reason() is None
        processes = cluster.processes
        redis_port = int(cluster.redis_url.rsplit(":", 1)[1].split("/")[0])
    assert {name: p.returncode for name, p in processes.items() if name != "redis"} == {
        "w0": 0,
        "w1": 0,
        "gateway": 0,
        "kvstore": 0,
    }
    workers_stopped = [stopped_at(cluster, w) for w in ["w0", "w1"]]
    assert stopped_at(cluster, "gateway") <= min(workers_stopped)
    assert stopped_at(cluster, "kvstore") >= max(workers_stopped)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", redis_port), timeout=1.0)


def test_a_child_that_exits_early_is_named_with_its_log(
    tmp_path: Path,
    redis_server: RedisServer,  # noqa: F811
    redis: redis_lib.Redis,
) -> None:
    cluster = make_cluster(tmp_path, redis_url=redis_server.url, extra_env={"FAKE_EXIT": "w1:3"})
    with pytest.raises(ServiceError, match="w1 exited with code 3 before it was ready") as info:
        cluster.start(deadline_s=60)
    assert "failing on purpose" in str(info.value)
    assert all(p.poll() is not None for p in cluster.processes.values())


def test_stale_heartbeat_is_not_taken_for_a_live_worker(
    tmp_path: Path,
    redis_server: RedisServer,  # noqa: F811
    redis: redis_lib.Redis,
) -> None:
    redis.set(heartbeat_key("w0"), "left by an earlier run", ex=60)
    cluster = make_cluster(tmp_path, redis_url=redis_server.url, extra_env={"FAKE_SILENT": "w0"})
    with pytest.raises(ServiceError, match=r"not ready after \d+ s: w0 \(no heartbeat yet\)"):
        cluster.start(deadline_s=3)
    assert all(p.poll() is not None for p in cluster.processes.values())


def test_stop_kills_a_child_that_ignores_sigterm(
    tmp_path: Path,
    redis_server: RedisServer,  # noqa: F811
    redis: redis_lib.Redis,
) -> None:
    cluster = make_cluster(
        tmp_path, redis_url=redis_server.url, extra_env={"FAKE_IGNORE_TERM": "w0"}
    )
    cluster.start(deadline_s=60)
    cluster.stop(timeout_s=1.0)
    codes = {name: p.returncode for name, p in cluster.processes.items()}
    assert codes == {"w0": -9, "w1": 0, "gateway": 0, "kvstore": 0}


def test_stop_without_draining_signals_every_part_at_once(
    tmp_path: Path,
    redis_server: RedisServer,  # noqa: F811
    redis: redis_lib.Redis,
) -> None:
    """Redis gone: nothing can be handed over, so the kvstore is not kept waiting for the
    workers (a drain stops it last), and only the part that ignores SIGTERM is killed."""
    reports: list[str] = []
    cluster = make_cluster(
        tmp_path,
        redis_url=redis_server.url,
        progress=reports.append,
        extra_env={"FAKE_IGNORE_TERM": "w0"},
    )
    cluster.start(deadline_s=60)
    reports.clear()
    before = time.time()
    cluster.stop(timeout_s=4.0, drain=False)
    codes = {name: p.returncode for name, p in cluster.processes.items()}
    assert codes == {"w0": -9, "w1": 0, "gateway": 0, "kvstore": 0}
    assert reports == ["w0 did not stop in time; killed it"]
    # a drain would signal the kvstore only once w0 was killed, 4 s in
    assert stopped_at(cluster, "kvstore") < before + 2.0


def test_kill_and_restart_a_worker(
    tmp_path: Path,
    redis_server: RedisServer,  # noqa: F811
    redis: redis_lib.Redis,
) -> None:
    with make_cluster(tmp_path, redis_url=redis_server.url) as cluster:
        old_pid = cluster.processes["w0"].pid
        assert cluster.kill("w0") == -9
        assert cluster.exited() == {"w0": -9}
        assert redis.exists(heartbeat_key("w0"))  # stale until its TTL lapses
        cluster.restart("w0", deadline_s=60)
        new_pid = cluster.processes["w0"].pid
        assert new_pid != old_pid
        assert json.loads(redis.get(heartbeat_key("w0")))["pid"] == new_pid
        assert cluster.exited() == {}


def test_unreachable_redis_url_fails_fast(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(ServiceError, match=r"cannot reach Redis at redis://127\.0\.0\.1"):
        cluster.start(deadline_s=60)
    assert cluster.processes == {}


def test_a_port_in_use_is_named_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cluster = make_cluster(tmp_path, port=taken.getsockname()[1])
        with pytest.raises(ServiceError, match=r"port \d+ is in use"):
            cluster.start(deadline_s=60)
    assert cluster.processes == {}
