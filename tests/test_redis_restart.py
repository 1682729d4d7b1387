"""Redis without persistence killed and restarted on its port while requests run: the
streams in flight end UNAVAILABLE at once, every part rebuilds what it owns (workers their
registration and groups, the kvstore its group and the index from the workers' inventories
and the spill directory), and the fleet serves again: sessions resume warm or from disk
with the right tokens, and Delete and Fork work."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis as redis_lib

from broker import keys
from engine.chat import render_chat
from engine.model import Model
from tests.test_cluster import common_prefix
from tests.test_kvstore_cluster import (
    Conversation,
    assert_exact,
    evict,
    records,
    settle,
    wait_for,
)
from warmfleet.client import Client, KVStoreClient
from warmfleet.launcher import Cluster
from warmfleet.processes import free_port
from warmfleet.redis_server import RedisServer
from warmfleet.v1 import inference_pb2 as pb

pytestmark = pytest.mark.slow


class Fleet:
    """A cluster on a Redis this test owns, so that it can kill and restart it."""

    def __init__(self, model_path: Path, tmp: pytest.TempPathFactory) -> None:
        self.port = free_port()
        self.redis = RedisServer(port=self.port).start()
        self.cluster = Cluster(
            num_workers=2,
            model=model_path,
            redis_url=self.redis.url,
            lease_s=2.0,
            spill_dir=tmp.mktemp("spill"),
            log_dir=tmp.mktemp("logs"),
        )

    def restart_redis(self) -> None:
        self.redis.stop(timeout_s=0)
        self.redis = RedisServer(port=self.port).start()


@pytest.fixture(scope="module")
def fleet(default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(default_model_path, tmp_path_factory)
    try:
        f.cluster.start()
        yield f
    finally:
        f.cluster.stop()
        f.redis.stop()


def prompt_ids(model: Model, messages: list[dict[str, str]]) -> list[int]:
    assert model.tokenizer.chat_template is not None
    return model.tokenizer.encode(render_chat(model.tokenizer.chat_template, messages))


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
        back = time.monotonic()
        for t in readers:
            t.join(timeout=60)
        assert [code for code, _ in ended] == [grpc.StatusCode.UNAVAILABLE] * 4
        slowest = max(at for _, at in ended) - killed
        print(f"streams in flight ended UNAVAILABLE {slowest:.2f} s after the kill")
        assert slowest < 5, slowest

        def serves() -> bool:
            try:
                client.complete("after", prompt="Hello", max_tokens=2, timeout_s=5)
            except grpc.RpcError:
                return False
            return True

        wait_for(serves, "a request to succeed", timeout_s=60)
        print(f"a new request succeeded {time.monotonic() - back:.2f} s after Redis was back")

        r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
        assert r.smembers(keys.WORKERS) == set(cluster.worker_ids)
        groups = {g["name"] for g in r.xinfo_groups(keys.KV_EVENTS)}
        assert keys.KV_GROUP in groups

        def rebuilt() -> bool:  # from the workers' inventories and the spill directory
            index = records(r)
            tiers = [index.get(c.session_id, {}).get("tier") for c in [*warm, disk]]
            return tiers == ["warm", "warm", "disk"]

        wait_for(rebuilt, "the index to be rebuilt")
        settle(r, kv)
        for c in warm:  # the kvstore learned from the workers' inventories where they are
            previous = prompt_ids(model, c.turns[-1][0]) + c.turns[-1][1].token_ids
            reply = c.turn(client, "How high is it?")
            assert reply.completion.kv_source == pb.KV_SOURCE_WARM
            prompt = prompt_ids(model, c.turns[-1][0])
            assert reply.completion.usage.cached_tokens == common_prefix(previous[:-1], prompt)
        reply = disk.turn(client, "How high is it?")  # from the spill directory's scan
        assert reply.completion.kv_source == pb.KV_SOURCE_DISK
        assert_exact(model, [t for c in [*warm, disk] for t in c.turns])

        fork = client.fork_session(warm[0].session_id, "keep-fork")
        assert fork.num_tokens > 0
        assert client.delete_session(warm[1].session_id) is True
        with pytest.raises(grpc.RpcError) as err:
            client.get_session(warm[1].session_id)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        r.close()
