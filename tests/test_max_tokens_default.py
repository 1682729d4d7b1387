"""Without max_tokens, an OpenAI request runs to the context's end (OpenAI's rule, and
llama-server's and vLLM's), while the gRPC API keeps its documented 256. The whole system on
a tiny model whose context is 512 positions (real Redis, a real worker process)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from gateway.validate import DEFAULT_MAX_TOKENS
from tests.tiny_gguf import write_tiny_llama
from warmfleet.client import Client
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
CONTEXT = 512  # more than DEFAULT_MAX_TOKENS past the prompt: the two rules differ here


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    path = write_tiny_llama(tmp_path_factory.mktemp("model") / "tiny.gguf", context_length=CONTEXT)
    config = ClusterConfig(num_workers=1, model=path, log_dir=tmp_path_factory.mktemp("logs"),
                           spill_dir=tmp_path_factory.mktemp("spill"))  # fmt: skip
    with Cluster(config) as c:
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
    with Client(cluster.target, timeout_s=120) as client:
        grpc_reply = client.complete("", prompt="the heather in the", ignore_eos=True)
    assert len(grpc_reply.token_ids) == DEFAULT_MAX_TOKENS
