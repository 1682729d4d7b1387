"""The kvstore's index against what the worker holds, after every one of a random sequence
of turns, forks, deletes and spills of sessions that share prompt blocks (real Redis,
gRPC, one worker process of the tiny model, its spill directory): the same sessions, the
same warm bytes (each shared block once), the same files."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_lib

from common.v1 import inference_pb2 as pb
from tests.cluster_helpers import settle
from tests.kv_checks import assert_index_matches_workers_and_disk
from tests.tiny_gguf import VOCAB_SIZE, write_tiny_llama
from warmfleet.client import Client, KVStoreClient
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
PREFIXES = [[int(t) for t in random.Random(i).choices(range(3, VOCAB_SIZE), k=40)]
            for i in range(2)]  # fmt: skip
SESSIONS = [f"s{i}" for i in range(6)]
BLOCK_BYTES = 16 * 2 * 2 * 32 * 2  # a block of the tiny model: 16 positions, 2 layers, float16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("accounting")
    config = ClusterConfig(
        num_workers=1,
        model=write_tiny_llama(tmp / "tiny.gguf"),
        spill_dir=tmp / "spill",
        warm_budget=12 * BLOCK_BYTES,  # a few sessions: the kvstore orders spills too
        log_dir=tmp / "logs",
    )
    with Cluster(config) as c:
        yield c


@pytest.mark.parametrize("seed", [1, 2])
def test_the_index_counts_what_the_worker_holds_after_random_operations(
    cluster: Cluster, seed: int
) -> None:
    rng = random.Random(seed)
    histories: dict[str, list[int]] = {}
    r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
    assert cluster.config.spill_dir is not None
    spill = Path(cluster.config.spill_dir)
    with (
        Client(cluster.target, timeout_s=60) as client,
        KVStoreClient(cluster.kvstore_target) as kv,
    ):
        for step in range(24):
            sid = rng.choice(SESSIONS)
            op = rng.random()
            if op < 0.5 or sid not in histories:  # a turn: the history and a few new tokens
                ids = histories.get(sid) or list(rng.choice(PREFIXES))
                ids = ids + [rng.randrange(3, VOCAB_SIZE) for _ in range(rng.randrange(1, 9))]
                reply = client.complete(f"{seed}-{sid}", token_ids=ids, max_tokens=4,
                                        ignore_eos=True)  # fmt: skip
                histories[sid] = ids + reply.token_ids
            elif op < 0.65:
                free = [s for s in SESSIONS if s not in histories]
                if free:  # ForkSession to an unused id: the same blocks, shared
                    new = rng.choice(free)
                    client.fork_session(f"{seed}-{sid}", f"{seed}-{new}")
                    histories[new] = list(histories[sid])
            elif op < 0.8:
                assert client.delete_session(f"{seed}-{sid}")
                del histories[sid]
            else:
                tier = kv.evict(f"{seed}-{sid}")
                assert tier in (pb.TIER_SPILLING, pb.TIER_DISK, pb.TIER_WARM)
            settle(r, kv)
            done = f"step {step}: {op=:.2f} on {sid}"
            assert_index_matches_workers_and_disk(r, cluster, spill, done)
