"""`warmfleet top` against a real cluster (Redis, gRPC, two worker processes with one batch
slot each, the real model): its JSON snapshot says what GetUsage and the queues in Redis
say, and its picture shows every worker."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib

from broker import fleet, keys
from common.enums import PRIORITIES
from engine.kv.kv_pool import BLOCK_TOKENS
from kvstore.usage import to_json
from tests.cluster_fixtures import cluster_client, cluster_redis  # noqa: F401
from tests.cluster_helpers import TENANT, records, settle, wait_for, worker_status
from tests.kv_checks import evict, spill_file
from warmfleet.client import Client, KVStoreClient
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.sizes import format_size

pytestmark = pytest.mark.slow
SESSIONS = [f"top-{i}" for i in range(4)]
EVICTED = SESSIONS[0]
# the default KV dtype, float16: 30 layers x 192 key and 192 value numbers a token, 2 bytes each
KV_BYTES_PER_TOKEN = 30 * 2 * 192 * 2


@pytest.fixture(scope="module")
def spill_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spill")


@pytest.fixture(scope="module")
def cluster(
    default_model_path: Path, spill_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    config = ClusterConfig(
        num_workers=2,
        model=default_model_path,
        spill_dir=spill_dir,
        worker_args=["--max-running", "1"],  # two long requests leave the third queued
        log_dir=tmp_path_factory.mktemp("logs"),
    )
    with Cluster(config) as c:
        yield c


@pytest.fixture(scope="module")
def kv(cluster: Cluster) -> Iterator[KVStoreClient]:
    with KVStoreClient(cluster.kvstore_target) as c:
        yield c


def top(cluster: Cluster, *options: str) -> str:
    argv = [sys.executable, "-m", "warmfleet.cli", "top", "--redis-url", cluster.redis_url]
    env = {**os.environ, "COLUMNS": "200", "LINES": "60"}
    done = subprocess.run(
        [*argv, *options], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def top_json(cluster: Cluster) -> dict[str, Any]:
    lines = top(cluster, "--once", "--json").splitlines()
    assert len(lines) == 1, lines
    return dict(json.loads(lines[0]))


def usage_json(kv: KVStoreClient) -> dict[str, Any]:
    return dict(json.loads(to_json(kv.usage())))


def published_usage(r: redis_lib.Redis, kv: KVStoreClient) -> dict[str, Any] | None:
    """GetUsage's report, once the copy the kvstore publishes in Redis is the same and each
    worker's own count of its pool (its heartbeat, every 0.5 s) has caught up with the
    index: until then a heartbeat can change the report while top reads it."""
    now = usage_json(kv)
    caught_up = all(w["pool_bytes"] == w["warm_bytes"] for w in now["workers"])
    return now if caught_up and json.loads(r.get(keys.KV_USAGE) or "null") == now else None


def responses_in_redis(r: redis_lib.Redis) -> dict[str, int]:
    """The gateways' counts of the calls they answered, by status ("grpc OK"...)."""
    counts = r.hgetall(keys.STATS)
    prefix = fleet.RESPONSE_PREFIX
    return {k.removeprefix(prefix): int(n) for k, n in counts.items() if k.startswith(prefix)}


def queues_in_redis(r: redis_lib.Redis) -> dict[str, Any]:
    """What the fair queues hold: the depth of every non-empty lane, the total, running."""
    lanes = {
        (p, t): r.llen(keys.fair_queue(p, t))
        for p in PRIORITIES
        for t in r.zrange(keys.fair_active(p), 0, -1)
    }
    running = {t: int(n) for t, n in r.hgetall(keys.RUNNING).items() if int(n)}
    waiting = int(r.get(keys.QUEUED) or 0)
    return {"lanes": {k: n for k, n in lanes.items() if n}, "waiting": waiting, "running": running}


def queues_in_snapshot(snap: dict[str, Any]) -> dict[str, Any]:
    q = snap["queues"]
    lanes = {(lane["priority"], lane["tenant"]): lane["depth"] for lane in q["lanes"]}
    return {"lanes": lanes, "waiting": q["waiting"], "running": q["running"]}


def test_json_snapshot_matches_get_usage_and_redis(
    cluster: Cluster, client: Client, kv: KVStoreClient, r: redis_lib.Redis, spill_dir: Path
) -> None:
    made = {}
    for sid in SESSIONS:
        reply = client.complete(sid, messages=[{"role": "user", "content": f"Hi, {sid}."}],
                                max_tokens=6)  # fmt: skip
        made[sid] = reply.completion
    settle(r, kv)
    evict(kv, r, EVICTED)
    # the kvstore publishes its report every 0.5 s (the workers' figures in it come from
    # their heartbeats, renewed as often), the gateway its counts every second
    expected = wait_for(lambda: published_usage(r, kv), "GetUsage's report in Redis")
    wait_for(lambda: sum(responses_in_redis(r).values()) >= len(SESSIONS), "responses counted")

    snap = top_json(cluster)

    assert usage_json(kv) == expected, "the fleet changed while top read it"
    assert snap["kvstore"] == {"alive": True, "usage": expected}
    usage = kv.usage()
    assert snap["sessions"]["tiers"] == expected["tiers"]
    assert snap["sessions"]["tiers"] == {"hot": 0, "warm": 3, "spilling": 0, "disk": 1, "gone": 0}
    assert usage.counters.spills >= 1 and usage.disk.used_bytes > 0
    # the sessions made, each where the index says, with the tokens it holds
    recent = {s["session_id"]: s for s in snap["sessions"]["recent"]}
    assert snap["sessions"]["total"] == len(SESSIONS) == len(recent)
    assert {sid: (s["tenant"], s["tier"], s["worker"]) for sid, s in recent.items()} == {
        sid: (TENANT, "disk", "") if sid == EVICTED else (TENANT, "warm", made[sid].worker_id)
        for sid in SESSIONS
    }
    for sid, c in made.items():
        assert recent[sid]["tokens"] == c.usage.prompt_tokens + c.usage.completion_tokens - 1
        if sid != EVICTED:  # warm: whole blocks of float16 KV, the bytes its worker holds
            held = recent[sid]["bytes"]
            assert held % (BLOCK_TOKENS * KV_BYTES_PER_TOKEN) == 0
            assert held >= recent[sid]["tokens"] * KV_BYTES_PER_TOKEN
    last_used = [s["last_used"] for s in snap["sessions"]["recent"]]
    assert last_used == sorted(last_used, reverse=True)
    # the evicted session's file and the blocks it lists: all the spill directory holds
    assert spill_file(spill_dir, EVICTED).is_file()
    disk_bytes = sum(f.stat().st_size for f in spill_dir.rglob("*") if f.is_file())
    assert recent[EVICTED]["bytes"] == disk_bytes == usage.disk.used_bytes
    assert_workers_agree(cluster, snap, usage.workers, made)
    assert queues_in_snapshot(snap) == queues_in_redis(r) == {
        "lanes": {}, "waiting": 0, "running": {}
    }  # fmt: skip
    assert snap["queues"]["admitted"] == int(r.hget(keys.STATS, "admitted")) >= len(SESSIONS)
    assert snap["responses"] == responses_in_redis(r)


def assert_workers_agree(
    cluster: Cluster, snap: dict[str, Any], workers: Any, made: dict[str, Any]
) -> None:
    """Each worker's figures in the snapshot are GetUsage's, and its sessions the index's."""
    by_id = {w.worker_id: w for w in workers}
    assert [w["id"] for w in snap["workers"]] == sorted(by_id) == cluster.worker_ids
    for w in snap["workers"]:
        u = by_id[w["id"]]
        assert w["state"] == "alive" and u.alive
        assert w["pool_bytes"] == u.pool_bytes
        assert w["warm_budget"] == u.warm_budget_bytes
        assert w["sessions"] == u.num_warm + u.num_hot
        assert (w["kv_dtype"], w["kv_bytes_per_token"]) == ("float16", KV_BYTES_PER_TOKEN)
        per_gib = round(w["sessions"] * (1 << 30) / w["pool_bytes"], 1) if w["sessions"] else None
        assert w["sessions_per_gib"] == per_gib
        assert (w["running"], w["paused"], w["slots"]) == (0, 0, 1)
        assert 0 <= w["heartbeat_age_s"] < 5
        generated = sum(
            c.usage.completion_tokens for c in made.values() if c.worker_id == u.worker_id
        )
        assert w["generated_tokens"] >= generated and w["step_seconds"] > 0


def test_picture_shows_every_worker_and_session(
    cluster: Cluster, kv: KVStoreClient, r: redis_lib.Redis
) -> None:
    text = top(cluster, "--once", "--interval", "0.2")
    rows = [line.split() for line in text.splitlines()]
    for w in cluster.worker_ids:  # running / slots
        assert [w, "alive", "0", "/", "1"] in [row[:5] for row in rows], text
    for sid, record in records(r).items():
        assert [TENANT, sid, record["tier"]] in [row[:3] for row in rows], text
    usage = kv.usage()
    t = usage.tiers
    assert f"(hot {t.hot}, warm {t.warm}, spilling {t.spilling}, disk {t.disk}, gone" in text
    assert f"{format_size(usage.disk.used_bytes)} / {format_size(usage.disk.budget_bytes)}" in text


def test_live_view_redraws_in_place_until_ctrl_c(cluster: Cluster) -> None:
    """On a terminal (a pty of 50 x 200), frame after frame; Ctrl-C ends it with status 0."""
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    argv = [sys.executable, "-m", "warmfleet.cli", "top", "--redis-url", cluster.redis_url]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [*argv, "--interval", "0.2"], stdin=terminal, stdout=terminal, stderr=terminal,
        env={**env, "TERM": "xterm-256color"},
    )  # fmt: skip
    os.close(terminal)
    try:
        text = read_until(master, lambda seen: seen.count("Workers: 2") >= 3, timeout_s=30)
        proc.send_signal(signal.SIGINT)
        # read on while it stops: a frame it is writing to a full terminal would block it
        read_until(master, lambda _: proc.poll() is not None, timeout_s=30)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert "\x1b[2K" in text  # lines erased and redrawn, not appended
    for w in cluster.worker_ids:
        assert f"\n{w} " in text.replace("\r", "")


def read_until(fd: int, done: Callable[[str], bool], timeout_s: float) -> str:
    """What a terminal shows until `done` holds of it (fails after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    seen = ""
    while not done(seen):
        left = deadline - time.monotonic()
        assert left > 0, f"timed out; the terminal showed {seen[-2000:]!r}"
        if select.select([fd], [], [], min(left, 0.1))[0]:
            try:
                seen += os.read(fd, 65536).decode(errors="replace")
            except OSError:  # the other end closed: the process is gone
                break
    return seen


def test_a_queued_request_shows_in_its_lane(
    cluster: Cluster, client: Client, r: redis_lib.Redis
) -> None:
    long: dict[str, Any] = {"max_tokens": 4000, "ignore_eos": True}
    calls = [client.stream(f"long-{i}", prompt="Count.", **long) for i in range(2)]
    try:
        wait_for(
            lambda: all(worker_status(r, w)["num_running"] == 1 for w in cluster.worker_ids),
            "both workers busy",
        )
        sent_at = time.time()
        calls.append(client.stream("waiting", prompt="Wait.", priority="batch", max_tokens=4))
        lane = ("batch", TENANT)
        wait_for(lambda: queues_in_redis(r)["lanes"].get(lane) == 1, "one request queued")

        snap = top_json(cluster)

        in_redis = queues_in_redis(r)
        assert in_redis == {"lanes": {lane: 1}, "waiting": 1, "running": {TENANT: 2}}
        assert queues_in_snapshot(snap) == in_redis
        [queued] = snap["queues"]["lanes"]
        assert 0 <= queued["oldest_age_s"] <= time.time() - sent_at
        assert [(w["running"], w["slots"]) for w in snap["workers"]] == [(1, 1), (1, 1)]
    finally:
        for call in reversed(calls):
            call.cancel()
    wait_for(lambda: queues_in_redis(r) == {"lanes": {}, "waiting": 0, "running": {}},
             "the queues to empty after the cancels")  # fmt: skip
