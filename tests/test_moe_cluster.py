"""The whole system serving a mixture-of-experts model: the tiny random `qwen3moe` (8
experts, top 2, with Qwen 2's vocabulary and Qwen 3's chat template), and the tiny random
`gpt-oss` (MXFP4 experts, sliding windows and sinks; Qwen 3's template too, whose prompts
run past its 16-position window) behind a real gateway, Redis and two worker processes.
Six agents talk at once for three turns each: every reply has the in-process engine's
tokens, every follow-up resumes warm on its session's worker; a session evicted to disk
comes back from it with the same tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_lib

from common.v1 import inference_pb2 as pb
from engine.model import Model
from tests.cluster_fixtures import cluster_redis  # noqa: F401
from tests.cluster_helpers import assert_turns_exact_and_warm, reference, talk_in_parallel
from tests.conftest import FIXTURES
from tests.kv_checks import evict
from tests.tiny_families import write_tiny
from tests.tiny_gpt_oss import write_tiny_gpt_oss
from warmfleet.client import Client, KVStoreClient
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
NEW_TOKENS = 8
TOPICS = ["rivers", "bridges", "owls", "tea", "rain", "maps"]


@pytest.fixture(scope="module", params=["qwen3moe", "gpt-oss"])
def model_path(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    template = (FIXTURES / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text()
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "gpt-oss":
        return write_tiny_gpt_oss(folder / "tiny-gpt-oss.gguf", chat_template=template)
    return write_tiny(folder / "tiny-moe.gguf", "qwen3moe", template)


@pytest.fixture(scope="module")
def model(model_path: Path) -> Model:
    return Model.load(model_path, device="cpu")


@pytest.fixture(scope="module")
def cluster(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    mk = tmp_path_factory.mktemp
    config = ClusterConfig(
        num_workers=2, model=model_path, log_dir=mk("logs"), spill_dir=mk("spill")
    )
    with Cluster(config) as c:
        yield c


def test_six_sessions_three_turns_exact_sticky_and_warm(cluster: Cluster, model: Model) -> None:
    scripts = {f"moe-{t}": [f"Tell me fact {n} on {t}." for n in range(3)] for t in TOPICS}
    with Client(cluster.target, timeout_s=120) as client:
        done = talk_in_parallel(client, scripts, NEW_TOKENS)
    for sid, turns in done.items():
        assert len(turns) == 3
        assert_turns_exact_and_warm(model, sid, turns, NEW_TOKENS)
    workers = {turns[0][1].completion.worker_id for turns in done.values()}
    assert workers <= set(cluster.worker_ids)


def test_a_session_evicted_to_disk_resumes_from_it_exactly(
    cluster: Cluster, model: Model, r: redis_lib.Redis
) -> None:
    first_turn = [{"role": "user", "content": "Name a colour."}]
    with Client(cluster.target, timeout_s=120) as client:
        first = client.complete("moe-disk", messages=first_turn, max_tokens=NEW_TOKENS)
        assert first.token_ids == reference(model, first_turn, NEW_TOKENS)[1]
        with KVStoreClient(cluster.kvstore_target) as kv:
            evict(kv, r, "moe-disk")
        reply = {"role": "assistant", "content": first.text}
        turn2 = [*first_turn, reply, {"role": "user", "content": "Another."}]
        second = client.complete("moe-disk", messages=turn2, max_tokens=NEW_TOKENS)
    assert second.completion.kv_source == pb.KV_SOURCE_DISK
    assert second.completion.usage.cached_tokens >= first.completion.usage.prompt_tokens
    assert second.token_ids == reference(model, turn2, NEW_TOKENS)[1]
