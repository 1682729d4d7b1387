"""The whole system with its worker on `--device cuda` (real Redis, gRPC, a worker process
of the tiny Q8_0 llama; where no GPU is found, the worker runs the CUDA sources on the CPU
through tests/cuda_emu): sessions served in one batch, a warm turn, a turn restored from
disk, a fork and a preempted batch request each give the tokens the in-process engine on
the same device gives the whole history cold: with CUDA's default float32 pool, and with a
q8_0 pool (its blocks' bytes on the device, converted at the host boundary)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import gguf
import pytest
import redis as redis_lib

from common.sampling import SamplingParams
from common.v1 import inference_pb2 as pb
from engine.model import Model
from engine.sequence import Request
from tests import cuda_emu
from tests.cluster_helpers import worker_status
from tests.cold_runs import cold_ids
from tests.kv_checks import evict
from tests.tiny_gguf import VOCAB_SIZE, write_tiny_llama
from warmfleet.client import Client, KVStoreClient, Reply
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cuda_module")]
NEW = 4
PROMPTS = {
    f"c{i}": [3 + (7 * i + 5 * j) % (VOCAB_SIZE - 3) for j in range(20 + 9 * i)] for i in range(3)
}


@pytest.fixture(scope="module", params=["float32", "q8_0"])  # float16: test_cuda_forward
def kv_dtype(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cuda") / "tiny-q8.gguf"
    return write_tiny_llama(path, matrix_type=gguf.GGMLQuantizationType.Q8_0, dim=128)


@pytest.fixture(scope="module")
def model(model_path: Path, kv_dtype: str, cuda_module: ModuleType) -> Model:
    return Model.load(model_path, device="cuda", kv_dtype=kv_dtype)


@pytest.fixture(scope="module")
def cluster(
    model_path: Path, kv_dtype: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp(f"cluster-{kv_dtype}")
    config = ClusterConfig(
        num_workers=1,
        model=model_path,
        device="cuda",
        kv_dtype=kv_dtype,
        worker_args=["--max-running", "2"],
        spill_dir=tmp / "spill",
        log_dir=tmp / "logs",
        extra_env=cuda_emu.process_env(),
    )
    with Cluster(config) as c:
        yield c


def cold(model: Model, ids: list[int], new: int = NEW) -> list[int]:
    """The in-process engine's greedy tokens for `ids`, from nothing cached."""
    sampling = SamplingParams(max_tokens=new, ignore_eos=True)
    return cold_ids(model, Request("ref", ids, sampling))


def turn(client: Client, sid: str, ids: list[int], new: int = NEW, **options: object) -> Reply:
    return client.complete(sid, token_ids=ids, max_tokens=new, ignore_eos=True, **options)


@pytest.fixture
def r(cluster: Cluster) -> Iterator[redis_lib.Redis]:
    client = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
    yield client
    client.close()


def test_the_worker_runs_the_quantized_model_on_cuda(
    cluster: Cluster, r: redis_lib.Redis, kv_dtype: str
) -> None:
    status = worker_status(r, cluster.worker_ids[0])
    got = (status["device"], status["weights"], status["kv_dtype"])
    assert got == ("cuda", "quantized", kv_dtype)


def test_batched_warm_restored_and_forked_sessions_give_a_cold_runs_tokens(
    cluster: Cluster, model: Model, r: redis_lib.Redis
) -> None:
    with (
        Client(cluster.target, timeout_s=300) as client,
        KVStoreClient(cluster.kvstore_target) as kv,
    ):
        with ThreadPoolExecutor(len(PROMPTS)) as pool:  # in one batch on the worker
            replies = pool.map(lambda x: turn(client, x, PROMPTS[x]), PROMPTS)
            first = dict(zip(PROMPTS, replies, strict=True))
        history = {s: PROMPTS[s] + first[s].token_ids for s in PROMPTS}
        for s, reply in first.items():
            assert reply.token_ids == cold(model, PROMPTS[s]), s

        ids = history["c0"] + [11, 12]  # warm
        warm = turn(client, "c0", ids)
        assert warm.completion.kv_source == pb.KV_SOURCE_WARM
        assert warm.token_ids == cold(model, ids)

        evict(kv, r, "c1")  # to disk and back
        ids = history["c1"] + [13]
        back = turn(client, "c1", ids)
        assert back.completion.kv_source == pb.KV_SOURCE_DISK
        assert back.completion.usage.cached_tokens >= len(history["c1"]) - 1
        assert back.token_ids == cold(model, ids)

        client.fork_session("c2", "c2-fork")  # the same blocks, copied on write
        for sid, extra in (("c2-fork", [14, 15]), ("c2", [16])):
            ids = history["c2"] + extra
            reply = turn(client, sid, ids)
            assert reply.completion.usage.cached_tokens >= len(history["c2"]) - 1
            assert reply.token_ids == cold(model, ids), sid


def test_a_preempted_batch_request_loses_nothing(cluster: Cluster, model: Model) -> None:
    with Client(cluster.target, timeout_s=300) as client:
        long = client.stream(
            "batch", token_ids=PROMPTS["c0"], max_tokens=24, ignore_eos=True, priority="batch"
        )
        parts = [next(iter(long))]  # it runs: with two interactive ones the worker is full
        asked = {"x0": PROMPTS["c1"], "x1": PROMPTS["c2"]}  # 16 tokens: both there at once
        with ThreadPoolExecutor(2) as pool:
            replies = pool.map(
                lambda x: turn(client, x, asked[x], 16, priority="interactive"), asked
            )
            for x, reply in zip(asked, replies, strict=True):
                assert reply.token_ids == cold(model, asked[x], 16), x
        parts += list(long)
    tokens = [t for part in parts if part.HasField("chunk") for t in part.chunk.token_ids]
    assert tokens == cold(model, PROMPTS["c0"], 24)  # paused and resumed, nothing lost
    log = cluster.log_path("w0").read_text()
    assert f"pausing {parts[-1].completion.request_id} (batch)" in log
