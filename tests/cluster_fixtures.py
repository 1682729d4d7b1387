"""Fixtures for tests that need a real Redis: one private server per test session, wiped per
test (`redis_server`, `redis`, `decoded`); and for tests of a whole cluster, the clients of
the module's `cluster` fixture (`client`, `r`), and one such cluster of one worker
(`one_worker_cluster`). Import the ones a module uses from here."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib
import redis.asyncio as aioredis

from broker.gateway_broker import GatewayBroker
from tests.cluster_helpers import one_worker
from warmfleet.client import Client
from warmfleet.launcher import Cluster
from warmfleet.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A memory-only redis-server on a free loopback port, for the whole test session."""
    with RedisServer() as server:
        yield server


def empty_client(server: RedisServer) -> redis_lib.Redis:
    """A client on `server`, after wiping every key from it."""
    client = redis_lib.Redis.from_url(server.url, socket_timeout=5.0)
    client.flushall()
    return client


@pytest.fixture(name="redis")
def redis_client(redis_server: RedisServer) -> Iterator[redis_lib.Redis]:
    """A client on the session's Redis, which holds no keys when the test starts."""
    client = empty_client(redis_server)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(name="decoded")
def decoded_client(redis: redis_lib.Redis, redis_server: RedisServer) -> Iterator[redis_lib.Redis]:
    """Like the services' own clients (replies decoded), on the emptied session Redis."""
    client = redis_lib.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(scope="module", name="client")
def cluster_client(cluster: Cluster) -> Iterator[Client]:
    """A gRPC client of the module's cluster."""
    with Client(cluster.target, timeout_s=180) as c:
        yield c


@pytest.fixture(scope="module", name="r")
def cluster_redis(cluster: Cluster) -> Iterator[redis_lib.Redis]:
    """A client (replies decoded) of the module's cluster's Redis."""
    client = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
    yield client
    client.close()


class SyncGatewayBroker:
    """The gateway's broker (async) driven from a plain test, each call run to its end."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.r = aioredis.Redis.from_url(url, decode_responses=True)
        self.broker = GatewayBroker(self.r)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.broker, name)
        return lambda *args, **kwargs: self.loop.run_until_complete(method(*args, **kwargs))

    def close(self) -> None:
        self.loop.run_until_complete(self.r.aclose())
        self.loop.close()


@pytest.fixture(name="gateway")
def sync_gateway(redis: redis_lib.Redis, redis_server: RedisServer) -> Iterator[Any]:
    """The gateway's broker on the emptied session Redis (typed Any: its calls are the async
    broker's, run to completion)."""
    g = SyncGatewayBroker(redis_server.url)
    yield g
    g.close()


@pytest.fixture(scope="module", name="cluster")
def one_worker_cluster(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """The module's cluster: the launcher with one worker serving the default model."""
    with one_worker(default_model_path, tmp_path_factory.mktemp) as c:
        yield c
