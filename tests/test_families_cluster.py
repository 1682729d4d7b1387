"""The whole system serving the Llama 3, Qwen 2 and Qwen 3 families: a tiny random model of
each (tests/tiny_families.py) with its family's real chat template, behind a real gateway,
Redis and worker process. The gateway renders and tokenizes as the engine expects (BOS, the
markup as control tokens), the worker's tokens equal the in-process engine's, the
session's next turn resumes warm on its worker, and one spilled to disk comes back from
it with the same tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis as redis_lib

from common.v1 import inference_pb2 as pb
from engine.model import Model
from tests.cluster_fixtures import cluster_redis  # noqa: F401
from tests.cluster_helpers import one_worker, prompt_ids, reference
from tests.conftest import FIXTURES
from tests.kv_checks import evict
from tests.tiny_families import write_tiny
from warmfleet.client import Client, KVStoreClient
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
TEMPLATES = {
    "llama3": "meta-llama-Llama-3.1-8B-Instruct",
    "qwen2": "Qwen-Qwen2.5-7B-Instruct",
    "qwen3": "Qwen-Qwen3-0.6B",
}
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name a colour."}]  # fmt: skip


@pytest.fixture(scope="module", params=list(TEMPLATES))
def model_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    template = (FIXTURES / "templates" / f"{TEMPLATES[request.param]}.jinja").read_text()
    folder = tmp_path_factory.mktemp(request.param)
    return write_tiny(folder / f"tiny-{request.param}.gguf", request.param, template)


@pytest.fixture(scope="module")
def cluster(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with one_worker(model_path, tmp_path_factory.mktemp) as c:
        yield c


def test_a_chat_is_served_as_the_engine_computes_it_and_resumes_warm(
    cluster: Cluster, model_path: Path
) -> None:
    model = Model.load(model_path, device="cpu")
    ids, expected = reference(model, MESSAGES, 6)
    with Client(cluster.target, timeout_s=120) as client:
        first = client.complete("agent-1", messages=MESSAGES, max_tokens=6)
        assert first.completion.usage.prompt_tokens == len(ids)
        assert list(first.token_ids) == expected
        turn2 = [
            *MESSAGES,
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "Another."},
        ]
        second = client.complete("agent-1", messages=turn2, max_tokens=6)
    assert second.completion.kv_source == pb.KV_SOURCE_WARM
    assert second.completion.worker_id == first.completion.worker_id
    assert second.completion.usage.cached_tokens >= len(ids)
    assert list(second.token_ids) == reference(model, turn2, 6)[1]


def test_a_session_spilled_to_disk_resumes_from_it_exactly(
    cluster: Cluster, model_path: Path, r: redis_lib.Redis
) -> None:
    model = Model.load(model_path, device="cpu")
    with Client(cluster.target, timeout_s=120) as client:
        first = client.complete("agent-3", messages=MESSAGES, max_tokens=6)
        with KVStoreClient(cluster.kvstore_target) as kv:
            evict(kv, r, "agent-3")
        turn2 = [
            *MESSAGES,
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "Another."},
        ]
        second = client.complete("agent-3", messages=turn2, max_tokens=6)
    assert second.completion.kv_source == pb.KV_SOURCE_DISK
    assert second.completion.usage.cached_tokens >= first.completion.usage.prompt_tokens
    assert list(second.token_ids) == reference(model, turn2, 6)[1]


def test_the_openai_face_answers_with_the_same_prompt(cluster: Cluster, model_path: Path) -> None:
    ids = prompt_ids(Model.load(model_path, device="cpu"), MESSAGES)
    body = {"messages": MESSAGES, "max_tokens": 4, "ignore_eos": True}
    with httpx.Client(base_url=cluster.http_url, timeout=120) as http:
        reply = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "agent-2"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] == len(ids)
    assert reply.json()["usage"]["completion_tokens"] == 4
