"""Fixtures for tests that need a real Redis: one private server per test session, wiped per test.

Import both from conftest: `from tests.cluster_fixtures import redis_client, redis_server`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis as redis_lib

from warmfleet.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A memory-only redis-server on a free loopback port, for the whole test session."""
    with RedisServer() as server:
        yield server


@pytest.fixture(name="redis")
def redis_client(redis_server: RedisServer) -> Iterator[redis_lib.Redis]:
    """A client on the session's Redis, which holds no keys when the test starts."""
    client = redis_lib.Redis.from_url(redis_server.url, socket_timeout=5.0)
    client.flushall()
    try:
        yield client
    finally:
        client.close()
