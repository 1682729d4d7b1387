"""The gateway's memory comes back after bursts of large HTTP bodies, served and refused
(bench/gateway_bursts.py's kinds: a 3.5 MB array beside a small prompt, a 3.9 MB prompt,
600 KB of prose tokenized then refused, 100k messages, JSON nested 1000 and 100k deep, a
5 MB body): a few rounds of every kind at once leave its RSS within RSS_SLACK_MB of where
it was before them, on a real cluster (the launcher, one worker, the real model). "Before"
is after one round of them (alone the gateway then settles 1-4 MB above its start). With
two malloc arenas this failed now and then (27 MB kept): a second arena's top is never
trimmed (gateway/memory.py); a failure names the heap's mappings and what each holds."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter

import pytest

from bench.gateway_bursts import BodyKind, body_kinds, burst, chat
from bench.soak_rss import rss_kib
from tests.cluster_fixtures import one_worker_cluster  # noqa: F401
from tests.cluster_helpers import wait_for
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
ROUNDS = 3
AT_ONCE = 8  # bodies of a kind sent together
RSS_SLACK_MB = 20.0
_KIB_PER_MB = 1024


def rss_mb(pid: int) -> float:
    kib = rss_kib(pid)
    assert kib is not None, f"process {pid} is gone"
    return kib / _KIB_PER_MB


def heap_mappings(pid: int) -> str:
    """The process's heap and anonymous mappings that hold 1 MB or more: size / resident."""
    held: list[str] = []
    name, size_kib = "", 0
    with open(f"/proc/{pid}/smaps", encoding="ascii", errors="replace") as f:
        for line in f:
            fields = line.split()
            if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", fields[0]):
                name = fields[5] if len(fields) > 5 else "anonymous"
                size_kib = 0
            elif fields[0] == "Size:":
                size_kib = int(fields[1])
            elif fields[0] == "Rss:" and int(fields[1]) >= _KIB_PER_MB and name[0] in "[a":
                held.append(f"{name} {size_kib // _KIB_PER_MB}/{int(fields[1]) // _KIB_PER_MB} MB")
    return ", ".join(held)


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
            f"(after the warm-up {first:.0f} MB; at most {peak:.0f}, now {rss_mb(pid):.0f}; "
            f"mapped / resident: {heap_mappings(pid)})"
        ),
        timeout_s=60,
    )
    print(f"gateway RSS: {first:.0f} MB at first, {before:.0f} MB before, {peak:.0f} MB at most,")
    print(f"{after:.0f} MB after")
