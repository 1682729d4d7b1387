"""RedisServer: a real redis-server process, started, used and stopped."""

from __future__ import annotations

import socket

import pytest
import redis as redis_lib

from common.errors import ServiceError
from tests.cluster_fixtures import empty_client, redis_server  # noqa: F401
from warmfleet.redis_server import RedisServer


def _refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
    except ConnectionRefusedError:
        return True
    return False


def test_serves_then_stop_frees_the_port() -> None:
    with RedisServer() as server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = redis_lib.Redis.from_url(server.url, socket_timeout=5.0)
        client.set("wf:test", "hello")
        assert client.get("wf:test") == b"hello"
        # memory only: nothing is ever written to disk
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
        client.close()
        port = server.port
        process = server.process
    assert process is not None and process.poll() is not None
    assert _refuses_connections(port)
    with socket.socket() as s:  # the port can be bound again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_stop_is_idempotent() -> None:
    server = RedisServer().start()
    server.stop()
    server.stop()
    assert server.process is not None and server.process.returncode is not None


def test_missing_binary_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(ServiceError, match="apt-get install -y redis-server"):
        RedisServer().start()


def test_early_exit_reports_its_output() -> None:
    server = RedisServer(extra_args=["--no-such-directive", "x"])
    with pytest.raises(ServiceError, match="Bad directive") as info:
        server.start()
    assert "before it was ready" in str(info.value)
    assert server.process is not None and server.process.returncode is not None


def test_port_in_use_is_a_clear_error(redis_server: RedisServer) -> None:  # noqa: F811
    with pytest.raises(ServiceError, match="Address already in use"):
        RedisServer(port=redis_server.port).start()


def test_each_test_starts_with_an_empty_redis(redis_server: RedisServer) -> None:  # noqa: F811
    left_behind = redis_lib.Redis.from_url(redis_server.url, socket_timeout=5.0)
    left_behind.set("wf:left-behind", "1")  # as an earlier test would leave it
    left_behind.close()
    client = empty_client(redis_server)  # what the `redis` fixture hands each test
    try:
        assert client.dbsize() == 0
    finally:
        client.close()
