"""Redis killed (SIGKILL) and started again on its port and data directory.

Without its state (the AOF wiped) while requests run: the streams in flight end UNAVAILABLE
at once, every part rebuilds what it owns (workers their registration and groups, the
kvstore its group and the index from the workers' inventories and the spill directory), and
the fleet serves again: sessions resume warm or from disk with the right tokens, and Delete
and Fork work. With its state (appendonly yes) after an outage longer than a heartbeat's
TTL: the sessions the workers still hold are listed warm on them again."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis as redis_lib

from broker import keys
from common.v1 import inference_pb2 as pb
from engine.model import Model
from tests.cluster_helpers import (
    Conversation,
    assert_exact,
    common_prefix,
    prompt_ids,
    records,
    settle,
    wait_for,
)
from tests.kv_checks import evict
from warmfleet.client import Client, KVStoreClient
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.processes import free_port
from warmfleet.redis_server import RedisServer

pytestmark = pytest.mark.slow


class Fleet:
    """A cluster on a Redis this test owns, so that it can kill and restart it."""

    def __init__(self, model_path: Path, tmp: pytest.TempPathFactory) -> None:
        self.port = free_port()
        self.data = tmp.mktemp("redis-data")
        self.redis = self._redis().start()
        self.cluster = Cluster(
            ClusterConfig(
                num_workers=2,
                model=model_path,
                redis_url=self.redis.url,
                lease_s=2.0,
                spill_dir=tmp.mktemp("spill"),
                log_dir=tmp.mktemp("logs"),
            )
        )

    def _redis(self) -> RedisServer:
        aof = ["--appendonly", "yes", "--dir", str(self.data)]
        return RedisServer(port=self.port, extra_args=aof)

    def restart_redis(self, *, keep_state: bool = False, outage_s: float = 0.0) -> None:
        """SIGKILL Redis, and start it again `outage_s` later on the same port and data
        directory: with what its AOF holds, or empty."""
        assert self.redis.process is not None
        self.redis.process.kill()
        self.redis.stop()
        if not keep_state:
            shutil.rmtree(self.data)
            self.data.mkdir()
        time.sleep(outage_s)
        self.redis = self._redis().start()

    def pause_workers(self, paused: bool) -> None:
        for name in self.cluster.worker_ids:
            process = self.cluster.processes[name]
            os.kill(process.pid, signal.SIGSTOP if paused else signal.SIGCONT)


@pytest.fixture(scope="module")
def fleet(default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(default_model_path, tmp_path_factory)
    try:
        f.cluster.start()
        yield f
    finally:
        f.cluster.stop()
        f.redis.stop()


def kill_redis_under_load(fleet: Fleet, client: Client) -> float:
    """Four streams running; Redis killed and restarted empty on its port. Each stream
    must end UNAVAILABLE; how long the slowest took after the kill."""
    streams = [
        iter(client.stream(f"load-{i}", prompt="Once upon a time", max_tokens=400))
        for i in range(4)
    ]
    for s in streams:
        assert next(s).HasField("chunk")  # all four run
    ended: list[tuple[grpc.StatusCode, float]] = []

    def drain(stream: Iterator[pb.GenerateResponse]) -> None:
        try:
            for _ in stream:
                pass
        except grpc.RpcError as e:
            ended.append((e.code(), time.monotonic()))

    readers = [threading.Thread(target=drain, args=(s,)) for s in streams]
    for t in readers:
        t.start()
    killed = time.monotonic()
    fleet.restart_redis()  # SIGKILL, then a new empty server on the same port
    for t in readers:
        t.join(timeout=60)
    assert [code for code, _ in ended] == [grpc.StatusCode.UNAVAILABLE] * 4
    return max(at for _, at in ended) - killed


def wait_until_serving(client: Client) -> float:
    """Seconds until a new request succeeds."""
    t0 = time.monotonic()

    def serves() -> bool:
        try:
            client.complete("after", prompt="Hello", max_tokens=2, timeout_s=5)
        except grpc.RpcError:
            return False
        return True

    wait_for(serves, "a request to succeed", timeout_s=60)
    return time.monotonic() - t0


def test_the_fleet_survives_redis_losing_its_state(fleet: Fleet, model: Model) -> None:
    cluster = fleet.cluster
    with (
        Client(cluster.target, timeout_s=120) as client,
        KVStoreClient(cluster.kvstore_target) as kv,
    ):
        r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
        warm = [Conversation(f"keep-{i}") for i in range(2)]
        disk = Conversation("on-disk")
        for c in [*warm, disk]:
            c.turn(client, f"Name a mountain, {c.session_id}.")
        settle(r, kv)
        evict(kv, r, disk.session_id)
        r.close()

        slowest = kill_redis_under_load(fleet, client)
        print(f"streams in flight ended UNAVAILABLE {slowest:.2f} s after the kill")
        assert slowest < 5, slowest
        print(f"a new request succeeded {wait_until_serving(client):.2f} s after Redis was back")
        r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
        check_rebuilt(r, kv, cluster, [*warm, disk])
        for c in warm:  # the kvstore learned from the workers' inventories where they are
            previous = prompt_ids(model, c.turns[-1][0]) + c.turns[-1][1].token_ids
            reply = c.turn(client, "How high is it?")
            assert reply.completion.kv_source == pb.KV_SOURCE_WARM
            prompt = prompt_ids(model, c.turns[-1][0])
            assert reply.completion.usage.cached_tokens == common_prefix(previous[:-1], prompt)
        reply = disk.turn(client, "How high is it?")  # from the spill directory's scan
        assert reply.completion.kv_source == pb.KV_SOURCE_DISK
        assert_exact(model, [t for c in [*warm, disk] for t in c.turns])
        check_delete_and_fork(client, warm[0].session_id, warm[1].session_id)
        r.close()


def check_rebuilt(
    r: redis_lib.Redis, kv: KVStoreClient, cluster: Cluster, sessions: list[Conversation]
) -> None:
    """Workers registered again, the kvstore's group back, the index rebuilt from the
    workers' inventories (the first two sessions, warm) and the spill directory (the last)."""
    every = set(cluster.worker_ids)  # each rejoins after its own back-off (2 s at most)
    wait_for(lambda: r.smembers(keys.WORKERS) == every, "every worker to register again")
    # the kvstore makes its group again after a back-off of its own: maybe after the workers'
    wait_for(lambda: keys.KV_GROUP in event_groups(r), "the kvstore's group to be made again")

    def rebuilt() -> bool:
        index = records(r)
        return [index.get(c.session_id, {}).get("tier") for c in sessions] == [
            "warm", "warm", "disk"
        ]  # fmt: skip

    wait_for(rebuilt, "the index to be rebuilt")
    settle(r, kv)


def event_groups(r: redis_lib.Redis) -> set[str]:
    """The consumer groups of the kvstore's event stream (none while the stream is missing)."""
    try:
        return {g["name"] for g in r.xinfo_groups(keys.KV_EVENTS)}
    except redis_lib.ResponseError:  # no such key
        return set()


def check_delete_and_fork(client: Client, to_fork: str, to_delete: str) -> None:
    assert client.fork_session(to_fork, f"{to_fork}-fork").num_tokens > 0
    assert client.delete_session(to_delete) is True
    with pytest.raises(grpc.RpcError) as err:
        client.get_session(to_delete)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_warm_sessions_are_listed_warm_again_after_redis_restarts_with_its_state(
    fleet: Fleet, model: Model
) -> None:
    cluster = fleet.cluster
    with (
        Client(cluster.target, timeout_s=120) as client,
        KVStoreClient(cluster.kvstore_target) as kv,
    ):
        r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
        talks = [Conversation(f"aof-{i}") for i in range(4)]
        for c in talks:
            c.turn(client, f"Name a river, {c.session_id}.")
        settle(r, kv)
        held = {c.session_id: records(r)[c.session_id]["worker"] for c in talks}
        assert all(held.values()), held
        r.close()

        # the workers stay paused a moment past Redis's return, so that the kvstore looks
        # at their heartbeats (lapsed in the outage) before they beat again
        fleet.pause_workers(True)
        try:
            fleet.restart_redis(keep_state=True, outage_s=5.0)
            r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
            lost = {sid: ("gone", "") for sid in held}
            wait_for(lambda: tiers(r, held) == lost, lambda: f"them lost: {tiers(r, held)}")
        finally:
            fleet.pause_workers(False)
        warm_again = {sid: ("warm", worker) for sid, worker in held.items()}
        wait_for(
            lambda: tiers(r, held) == warm_again,
            lambda: f"them warm on their workers: {tiers(r, held)}",
            timeout_s=60,
        )
        listed = {s.session_id: (s.tier, s.worker_id) for s in client.list_sessions()}
        assert {sid: listed[sid] for sid in held} == {
            sid: (pb.TIER_WARM, worker) for sid, worker in held.items()
        }
        for c in talks:  # served where the index says, from the KV kept there
            previous = prompt_ids(model, c.turns[-1][0]) + c.turns[-1][1].token_ids
            reply = c.turn(client, "How long is it?")
            assert reply.completion.kv_source == pb.KV_SOURCE_WARM
            assert reply.completion.worker_id == held[c.session_id]
            prompt = prompt_ids(model, c.turns[-1][0])
            assert reply.completion.usage.cached_tokens == common_prefix(previous[:-1], prompt)
        assert_exact(model, [t for c in talks for t in c.turns])
        r.close()


def tiers(r: redis_lib.Redis, sessions: dict[str, str]) -> dict[str, tuple[str, str]]:
    """(tier, worker) of each session, as the index in Redis holds them."""
    index = records(r)
    found = {sid: index.get(sid, {}) for sid in sessions}
    return {
        sid: (record.get("tier", ""), record.get("worker", "")) for sid, record in found.items()
    }
