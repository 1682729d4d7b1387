"""The cluster tests' core with the worker on MLX (its CPU build here): real Redis, gRPC
over loopback, one `warmfleet worker --device mlx` process and the real default model.
Every reply is checked against the in-process CPU engine: MLX must give the same tokens."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_lib

from broker import codec, keys
from broker.messages import Completion
from common.enums import FinishReason
from common.v1 import inference_pb2 as pb
from engine.model import Model
from tests.cluster_fixtures import cluster_client, cluster_redis  # noqa: F401
from tests.cluster_helpers import (
    assert_turns_exact_and_warm,
    reference,
    talk_in_parallel,
    wait_for,
    worker_status,
)
from tests.kv_checks import evict
from warmfleet.client import Client, KVStoreClient
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
NEW_TOKENS = 8  # MLX's CPU build takes ~0.1 s per token: short turns
SCRIPTS = {
    "mlx-france": ["What is the capital of France?", "And of Italy?"],
    "mlx-colors": ["Name a primary color.", "Name another one."],
    "mlx-math": ["What is 2 + 2?", "What is 3 + 3?"],
}


@pytest.fixture(scope="module")
def cluster(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    config = ClusterConfig(
        num_workers=1,
        model=default_model_path,
        device="mlx",
        lease_s=2.0,
        log_dir=tmp_path_factory.mktemp("mlx-logs"),
        spill_dir=tmp_path_factory.mktemp("mlx-spill"),
    )
    with Cluster(config) as c:
        yield c


@pytest.fixture(scope="module")
def model(model_kv_float32: Model) -> Model:
    """The CPU reference, with the KV dtype of MLX's pool (float32)."""
    return model_kv_float32


@pytest.fixture(scope="module")
def redis(r: redis_lib.Redis) -> redis_lib.Redis:
    return r


@pytest.fixture(scope="module")
def kv(cluster: Cluster) -> Iterator[KVStoreClient]:
    with KVStoreClient(cluster.kvstore_target) as c:
        yield c


def test_the_worker_runs_the_quantized_model_on_mlx(
    cluster: Cluster, redis: redis_lib.Redis, model_mlx: Model
) -> None:
    (worker_id,) = cluster.worker_ids
    status = worker_status(redis, worker_id)
    assert (status["device"], status["weights"]) == ("mlx", "quantized")
    assert status["weight_bytes"] == model_mlx.weight_bytes
    assert status["kv_dtype"] == "float16"  # auto on MLX, as on the CPU


def test_sessions_are_sticky_warm_and_exact(cluster: Cluster, client: Client, model: Model) -> None:
    done = talk_in_parallel(client, SCRIPTS, NEW_TOKENS)  # all three sessions at once
    for sid, turns in done.items():
        held = assert_turns_exact_and_warm(model, sid, turns, NEW_TOKENS)
        record = client.get_session(sid)
        assert record.worker_id == cluster.worker_ids[0]
        assert record.tier == pb.TIER_WARM and record.num_tokens == held


def test_a_session_evicted_to_disk_comes_back_from_it(
    client: Client, kv: KVStoreClient, redis: redis_lib.Redis, model: Model
) -> None:
    messages = [{"role": "user", "content": "Say hello in Spanish."}]
    first = client.complete("mlx-disk", messages=messages, max_tokens=NEW_TOKENS)
    held = first.completion.usage.prompt_tokens + len(first.token_ids) - 1
    evict(kv, redis, "mlx-disk")  # written by the MLX worker, in the common file format
    messages += [{"role": "assistant", "content": first.text},
                 {"role": "user", "content": "And in German?"}]  # fmt: skip
    second = client.complete("mlx-disk", messages=messages, max_tokens=NEW_TOKENS)
    assert second.completion.kv_source == pb.KV_SOURCE_DISK
    assert second.completion.usage.cached_tokens >= held - 4  # all but the template's tokens
    assert second.token_ids == reference(model, messages, NEW_TOKENS)[1]


def test_cancel_frees_the_sequence(
    cluster: Cluster, client: Client, model: Model, redis: redis_lib.Redis
) -> None:
    (worker_id,) = cluster.worker_ids
    call = client.stream("mlx-cancel", prompt="Once upon a time,", max_tokens=400)
    chunks, rid = 0, ""
    for response in call:
        chunks += response.HasField("chunk")
        if chunks == 1:
            rid = wait_for(lambda: worker_status(redis, worker_id)["running"], "a running request")[
                0
            ]
        if chunks == 3:
            break
    call.cancel()
    deadline = time.monotonic() + 30
    while rid in worker_status(redis, worker_id)["running"]:
        assert time.monotonic() < deadline, "the cancelled request still runs after 30 s"
        time.sleep(0.01)
    last = redis.xrevrange(keys.out_stream(rid), count=1)[0][1]
    done = codec.decode_fields(last, Completion)
    assert done.finish_reason == FinishReason.CANCELLED and done.usage.completion_tokens < 400
    healthy = [{"role": "user", "content": "What is the capital of Spain?"}]
    reply = client.complete("mlx-after-cancel", messages=healthy, max_tokens=NEW_TOKENS)
    assert reply.token_ids == reference(model, healthy, NEW_TOKENS)[1]
