"""Without max_tokens, an OpenAI request runs to the context's end (OpenAI's rule, and
llama-server's and vLLM's), while the gRPC API keeps its documented 256; a max_tokens past
the context's end is cut to it. The whole system on
a tiny model whose context is 512 positions (real Redis, a real worker process)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.errors import InvalidRequestError
from engine.model import Model
from gateway.validate import DEFAULT_MAX_TOKENS, GenerateInput, build_job
from tests.cluster_helpers import one_worker
from tests.tiny_gguf import write_tiny_llama
from warmfleet.client import Client
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
CONTEXT = 512  # more than DEFAULT_MAX_TOKENS past the prompt: the two rules differ here


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("model") / "tiny.gguf", context_length=CONTEXT)


@pytest.fixture(scope="module")
def cluster(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with one_worker(tiny_path, tmp_path_factory.mktemp) as c:
        yield c


def test_openai_without_max_tokens_runs_to_the_context_end(cluster: Cluster) -> None:
    body = {"prompt": "the heather in the", "ignore_eos": True}
    with httpx.Client(base_url=cluster.http_url, timeout=120) as http:
        reply = http.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        usage = reply.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == CONTEXT
        assert reply.json()["choices"][0]["finish_reason"] == "length"
        capped = http.post("/v1/completions", json={**body, "max_tokens": 7}).json()
        assert capped["usage"]["completion_tokens"] == 7
        past = http.post("/v1/completions", json={**body, "max_tokens": 10**6}).json()
        assert past["usage"] == usage  # past the context: it ends there, as without one
    with Client(cluster.target, timeout_s=120) as client:
        grpc_reply = client.complete("", prompt="the heather in the", ignore_eos=True)
    assert len(grpc_reply.token_ids) == DEFAULT_MAX_TOKENS


def test_max_tokens_past_the_context_is_cut_to_it(tiny_path: Path) -> None:
    """What the fair queues charge (prompt + max_tokens) is what can run: Claude Code asks
    32,000 tokens of every request."""
    model = Model.load(tiny_path, device="cpu")
    room = CONTEXT - len(model.tokenizer.encode("the heather in the"))
    for asked, min_tokens, expected in ((10**6, 0, room), (10**6, 10**5, room), (9, 3, 9)):
        inp = GenerateInput(prompt="the heather in the", max_tokens=asked, min_tokens=min_tokens)
        job = build_job(inp, "t", model.tokenizer, model.config, 60.0)
        assert job.sampling.max_tokens == expected
        assert job.sampling.min_tokens == min(min_tokens, expected)
    with pytest.raises(InvalidRequestError, match="min_tokens"):  # checked as asked
        build_job(GenerateInput(prompt="x", max_tokens=5, min_tokens=6), "t", model.tokenizer,
                  model.config, 60.0)  # fmt: skip
