"""The gateway's memory comes back after bursts of large HTTP bodies, served and refused
(bench/gateway_bursts.py's kinds: a 3.5 MB array beside a small prompt, a 3.9 MB prompt,
600 KB of prose tokenized then refused, 100k messages, JSON nested 1000 and 100k deep, a
5 MB body): a few rounds of every kind at once leave its RSS within RSS_SLACK_MB of where
it was before them, on a real cluster (the launcher, one worker, the real model). "Before"
is after one round of them (alone the gateway then settles 1-4 MB above its start). Known
flaky inside the whole suite: there the gateway has stayed 27 MB above "before" (106 MB,
peak 321) after 60 s, where alone it comes back within 2 MB; the cause is not found."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.gateway_bursts import BodyKind, body_kinds, burst, chat
from bench.soak_rss import rss_kib
from tests.cluster_helpers import one_worker, wait_for
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
ROUNDS = 3
AT_ONCE = 8  # bodies of a kind sent together
RSS_SLACK_MB = 20.0
_KIB_PER_MB = 1024


@pytest.fixture(scope="module")
def cluster(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with one_worker(default_model_path, tmp_path_factory.mktemp) as c:
        yield c


def rss_mb(pid: int) -> float:
    kib = rss_kib(pid)
    assert kib is not None, f"process {pid} is gone"
    return kib / _KIB_PER_MB


def settled_rss_mb(pid: int) -> float:
    """The RSS once two readings a second apart are within 1 MB of each other."""
    deadline = time.monotonic() + 60
    last = rss_mb(pid)
    while True:
        time.sleep(1.0)
        now = rss_mb(pid)
        if abs(now - last) < 1.0:
            return now
        assert time.monotonic() < deadline, f"the gateway's RSS did not settle: {now:.0f} MB"
        last = now


async def bursts(
    url: str, pid: int, kinds: dict[str, BodyKind]
) -> tuple[Counter[tuple[str, int]], float]:
    """ROUNDS bursts of every kind; the answers, and the highest RSS seen meanwhile."""
    answers: Counter[tuple[str, int]] = Counter()
    peak = 0.0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mb(pid))
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    for _ in range(ROUNDS):
        answers += await burst(url, kinds, AT_ONCE)
    done.set()
    await sampler
    return answers, peak


def test_memory_returns_after_bursts_of_large_bodies(cluster: Cluster) -> None:
    pid = cluster.processes["gateway"].pid
    warm_up = {"warm-up": BodyKind(200, lambda i: json.dumps(chat("Hi")).encode())}
    assert asyncio.run(burst(cluster.http_url, warm_up, 2)) == {("warm-up", 200): 2}
    first = settled_rss_mb(pid)
    kinds = body_kinds()
    asyncio.run(burst(cluster.http_url, kinds, AT_ONCE))
    before = settled_rss_mb(pid)
    answers, peak = asyncio.run(bursts(cluster.http_url, pid, kinds))
    # every body got its answer: the served ones served, the others refused as they should be
    assert answers == {(name, kind.status): ROUNDS * AT_ONCE for name, kind in kinds.items()}
    assert peak > before + 2 * RSS_SLACK_MB, "the bursts hardly grew the heap: nothing tested"
    after = wait_for(
        lambda: (rss := rss_mb(pid)) <= before + RSS_SLACK_MB and rss,
        lambda: (
            f"the gateway's RSS to come back within {RSS_SLACK_MB} MB of {before:.0f} MB "
            f"(after the warm-up {first:.0f} MB; at most {peak:.0f}, now {rss_mb(pid):.0f})"
        ),
        timeout_s=60,
    )
    print(f"gateway RSS: {first:.0f} MB at first, {before:.0f} MB before, {peak:.0f} MB at most,")
    print(f"{after:.0f} MB after")
