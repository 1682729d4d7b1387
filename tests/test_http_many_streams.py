"""One gateway holds a thousand open streams at once (queued behind one worker of the tiny
model) and answers them all, without a thread per stream and with a fixed number of Redis
connections."""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.cluster_helpers import write_keys
from tests.tiny_gguf import write_tiny_llama
from warmfleet.cluster_config import ClusterConfig
from warmfleet.commands.gateway import REDIS_CONNECTIONS, SPARE_FILES, TOKENIZER_THREADS
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
NUM_STREAMS = 1000
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("many")
    keys = write_keys(tmp / "keys.toml", {"many": "max_queued = 2000\nmax_concurrent = 64"})
    config = ClusterConfig(
        num_workers=1,
        model=write_tiny_llama(tmp / "tiny.gguf"),
        keys_file=tmp / "keys.toml",
        gateway_args=["--max-queued", "2000"],
        extra_env={"MANY_KEY": keys["many"]},
        log_dir=tmp / "logs",
    )
    with Cluster(config) as c:
        yield c


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def streams_allowed() -> int:
    """NUM_STREAMS, or fewer where the hard limit on open files (which the gateway shares)
    does not leave room for them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 8192
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    return min(NUM_STREAMS, hard - REDIS_CONNECTIONS - SPARE_FILES)


def redis_clients(url: str) -> int:
    with redis.Redis.from_url(url) as r:
        return len(r.client_list())


async def hold_streams(
    url: str, key: str, gateway_pid: int, num_streams: int, redis_url: str
) -> tuple[list[int], int, int]:
    """Open every stream, count the gateway's threads and Redis's clients once all are
    open, read them all; (events per stream, threads and Redis clients while all were
    open)."""
    all_open = asyncio.Event()
    opened = 0
    limits = httpx.Limits(max_connections=num_streams + 10, max_keepalive_connections=0)
    body = {"prompt": "hello there", "max_tokens": NEW_TOKENS, "ignore_eos": True,
            "stream": True}  # fmt: skip
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=300,
                                 headers={"Authorization": f"Bearer {key}"}) as client:  # fmt: skip
        failures: list[BaseException] = []

        async def one() -> int:
            nonlocal opened
            try:
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    assert r.status_code == 200, await r.aread()
                    opened += 1
                    if opened == num_streams:
                        all_open.set()
                    lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
            except BaseException as e:  # a stream that fails ends the wait for all to open
                failures.append(e)
                all_open.set()
                raise
            assert lines[-1] == "data: [DONE]"
            return len(lines)

        tasks = [asyncio.create_task(one()) for _ in range(num_streams)]
        await asyncio.wait_for(all_open.wait(), timeout=300)
        if failures:
            raise failures[0]
        during, clients = threads_of(gateway_pid), redis_clients(redis_url)
        counts = await asyncio.gather(*tasks)
    return counts, during, clients


def test_a_thousand_open_streams_cost_no_thread_each(cluster: Cluster) -> None:
    num_streams = streams_allowed()
    key = cluster.config.extra_env["MANY_KEY"]
    gateway_pid = cluster.processes["gateway"].pid
    with httpx.Client(base_url=cluster.http_url, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as c:  # fmt: skip
        warm = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert warm.status_code == 200, warm.text
    before, clients_before = threads_of(gateway_pid), redis_clients(cluster.redis_url)
    counts, during, clients = asyncio.run(
        hold_streams(cluster.http_url, key, gateway_pid, num_streams, cluster.redis_url)
    )
    assert len(counts) == num_streams
    # each: a chunk per token with text (at most NEW_TOKENS), the finish chunk, [DONE]
    assert all(2 <= n <= NEW_TOKENS + 2 for n in counts), sorted(set(counts))
    print(f"gateway threads: {before} before, {during} with {num_streams} streams open; "
          f"redis clients: {clients_before} before, {clients} with them open")  # fmt: skip
    assert during <= before + TOKENIZER_THREADS  # the tokenizer pool fills up; nothing more
    assert clients <= clients_before + REDIS_CONNECTIONS  # the gateway's pool, at most
