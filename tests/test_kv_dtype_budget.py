"""The KV dtype in the warm budget, through the whole system (real Redis, gRPC, the kvstore,
one worker process of the tiny model): with a budget that fits N float32 sessions, the
kvstore's index keeps twice as many float16 sessions of the same length warm before it
spills, and 3.5 times as many q8_0 ones, and every byte figure (the heartbeat, the index,
GetUsage, the spill files) is the dtype's."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_lib

from engine.kv.kv_pool import BLOCK_TOKENS
from engine.kv_files.kv_dtypes import kv_dtype_named, value_bytes
from tests.cluster_helpers import records, settle, worker_status
from tests.tiny_gguf import VOCAB_SIZE, write_tiny_llama
from warmfleet.client import Client, KVStoreClient
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
LAYERS, KV_DIM = 2, 64  # the tiny model's (heads of 32 values: one q8_0 block)
NUM_SESSIONS = 16
SESSION_BLOCKS = 3  # 47 prompt tokens and one generated: 47 positions held, 3 blocks
FLOAT32_SESSIONS = 3  # N: the budget fits three float32 sessions and half a fourth
BUDGET = (2 * FLOAT32_SESSIONS + 1) * SESSION_BLOCKS * BLOCK_TOKENS * 2 * LAYERS * KV_DIM * 2


def block_bytes(dtype: str) -> int:
    return int(BLOCK_TOKENS * 2 * LAYERS * KV_DIM * value_bytes(kv_dtype_named(dtype)))


@pytest.fixture(scope="module", params=["float32", "float16", "q8_0"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp(f"budget-{request.param}")
    config = ClusterConfig(
        num_workers=1,
        model=write_tiny_llama(tmp / "tiny.gguf", dim=128),
        spill_dir=tmp / "spill",
        warm_budget=BUDGET,
        kv_dtype=request.param,
        log_dir=tmp / "logs",
    )
    with Cluster(config) as c:
        yield c


def test_the_warm_budget_holds_sessions_by_the_bytes_of_their_dtype(cluster: Cluster) -> None:
    dtype = cluster.config.kv_dtype
    assert dtype is not None
    session_bytes = SESSION_BLOCKS * block_bytes(dtype)
    rng = random.Random(7)
    r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
    with (
        Client(cluster.target, timeout_s=60) as client,
        KVStoreClient(cluster.kvstore_target) as kv,
    ):
        warm_before_a_spill = 0
        for i in range(NUM_SESSIONS):  # distinct prompts: no block is shared
            ids = [rng.randrange(3, VOCAB_SIZE) for _ in range(47)]
            client.complete(f"s{i}", token_ids=ids, max_tokens=1, ignore_eos=True)
            usage = settle(r, kv)
            if usage.counters.spills == 0:
                warm_before_a_spill = usage.workers[0].num_warm
        (worker,) = usage.workers
    status = worker_status(r, "w0")
    tiers = [rec["tier"] for rec in records(r).values()]
    r.close()
    # every figure in the dtype's bytes
    assert status["kv_dtype"] == dtype
    assert status["kv_blocks"]["block_bytes"] == block_bytes(dtype)
    assert worker.warm_bytes == worker.num_warm * session_bytes == status["pool_bytes"]
    assert worker.warm_bytes <= BUDGET < worker.warm_bytes + session_bytes  # full, not over
    assert tiers.count("warm") == worker.num_warm and tiers.count("disk") == usage.tiers.disk
    assert worker.num_warm + usage.tiers.disk == NUM_SESSIONS
    files = [f for f in Path(str(cluster.config.spill_dir)).rglob("*") if f.is_file()]
    assert usage.disk.used_bytes == sum(f.stat().st_size for f in files)
    # a session on disk: its 47 positions' values in the dtype, plus a small header
    assert usage.tiers.disk * 47 * block_bytes(dtype) // BLOCK_TOKENS <= usage.disk.used_bytes
    assert usage.disk.used_bytes < usage.tiers.disk * (session_bytes + 8192)
    expected = BUDGET // session_bytes  # float32 3, float16 7, q8_0 13
    assert worker.num_warm == warm_before_a_spill == expected
    assert expected >= {"float32": 1.0, "float16": 1.9, "q8_0": 3.5}[dtype] * FLOAT32_SESSIONS
