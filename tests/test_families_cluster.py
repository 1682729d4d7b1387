"""The whole system serving the Llama 3 and Qwen 2 families: a tiny random model of each
(tests/tiny_families.py) with its family's real chat template, behind a real gateway, Redis
and worker process. The gateway renders and tokenizes as the engine expects (BOS, the
markup as control tokens), the worker's tokens equal the in-process engine's, and the
session's next turn resumes warm."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.sampling import SamplingParams
from common.v1 import inference_pb2 as pb
from engine.chat import render_chat
from engine.engine import Engine
from engine.model import Model
from engine.sequence import Request
from tests.conftest import FIXTURES
from tests.tiny_families import write_tiny
from warmfleet.client import Client
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
TEMPLATES = {"llama3": "meta-llama-Llama-3.1-8B-Instruct", "qwen2": "Qwen-Qwen2.5-7B-Instruct"}
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name a colour."}]  # fmt: skip


@pytest.fixture(scope="module", params=list(TEMPLATES))
def model_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    template = (FIXTURES / "templates" / f"{TEMPLATES[request.param]}.jinja").read_text()
    folder = tmp_path_factory.mktemp(request.param)
    return write_tiny(folder / f"tiny-{request.param}.gguf", request.param, template)


@pytest.fixture(scope="module")
def cluster(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    config = ClusterConfig(num_workers=1, model=model_path, log_dir=tmp_path_factory.mktemp("logs"),
                           spill_dir=tmp_path_factory.mktemp("spill"))  # fmt: skip
    with Cluster(config) as c:
        yield c


def test_a_chat_is_served_as_the_engine_computes_it_and_resumes_warm(
    cluster: Cluster, model_path: Path
) -> None:
    model = Model.load(model_path, device="cpu")
    ids = model.tokenizer.encode(render_chat(model.tokenizer.chat_template or "", MESSAGES))
    request = Request("r", ids, SamplingParams(max_tokens=6, ignore_eos=True))
    expected = [t for out in Engine(model).generate([request])["r"] for t in out.token_ids]
    with Client(cluster.target, timeout_s=120) as client:
        first = client.complete("agent-1", messages=MESSAGES, max_tokens=6, ignore_eos=True)
        assert first.completion.usage.prompt_tokens == len(ids)
        assert list(first.token_ids) == expected
        turn2 = [*MESSAGES, {"role": "assistant", "content": first.text},
                 {"role": "user", "content": "Another."}]  # fmt: skip
        second = client.complete("agent-1", messages=turn2, max_tokens=6, ignore_eos=True)
    assert second.completion.kv_source == pb.KV_SOURCE_WARM
    assert second.completion.usage.cached_tokens >= len(ids)


def test_the_openai_face_answers_with_the_same_prompt(cluster: Cluster, model_path: Path) -> None:
    model = Model.load(model_path, device="cpu")
    ids = model.tokenizer.encode(render_chat(model.tokenizer.chat_template or "", MESSAGES))
    body = {"messages": MESSAGES, "max_tokens": 4, "ignore_eos": True}
    with httpx.Client(base_url=cluster.http_url, timeout=120) as http:
        reply = http.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "agent-2"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] == len(ids)
    assert reply.json()["usage"]["completion_tokens"] == 4
