"""Redis connections with finite timeouts everywhere."""

from __future__ import annotations

import os
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
CONNECT_TIMEOUT_S = 1.0


def redis_url_default() -> str:
    return os.environ.get("WARMFLEET_REDIS_URL", DEFAULT_REDIS_URL)


def _timeouts(block_ms: int) -> dict[str, Any]:
    """Connection options both clients share: finite timeouts, text replies."""
    return {
        "decode_responses": True,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": block_ms / 1000 + 5.0,
        "health_check_interval": 15,
    }


def connect(url: str, *, block_ms: int, max_connections: int | None = None) -> redis.Redis:
    """A client whose every call fails within block_ms plus a few seconds, never hangs."""
    pool = redis.ConnectionPool.from_url(
        url, max_connections=max_connections, **_timeouts(block_ms)
    )
    return redis.Redis(connection_pool=pool)


def connect_async(url: str, *, block_ms: int, pool_size: int, wait_s: float) -> aioredis.Redis:
    """`connect` for an event loop, over a fixed pool of `pool_size` connections: a caller
    finding them all busy waits for one up to `wait_s` (then redis.ConnectionError), so a
    thousand concurrent calls share the pool instead of opening a socket each. A call that
    fails is not retried here: the caller sees the failure at once (a stream in flight when
    Redis dies ends UNAVAILABLE at once)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=pool_size, timeout=wait_s, **_timeouts(block_ms)
    )
    return aioredis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))
