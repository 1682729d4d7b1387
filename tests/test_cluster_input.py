"""The whole system refuses bad input precisely and disturbs no one with it; sessions named
by metadata, deleted and forked. Same cluster as test_cluster.py (real Redis, gRPC, two
worker processes, the real model)."""

from __future__ import annotations

import grpc
import pytest
import redis as redis_lib

from common.v1 import inference_pb2 as pb
from engine.model import Model
from tests.cluster_fixtures import cluster_client, cluster_redis  # noqa: F401
from tests.cluster_helpers import reference, wait_for, worker_status
from warmfleet.client import Client, collect
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
NEW_TOKENS = 20


@pytest.fixture(scope="module")
def cluster(default_cluster: Cluster) -> Cluster:
    return default_cluster


@pytest.fixture(scope="module")
def redis(r: redis_lib.Redis) -> redis_lib.Redis:
    return r


BAD_INPUTS = [
    ("empty prompt", dict(prompt=""), grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
    ("no input", dict(), grpc.StatusCode.INVALID_ARGUMENT, "input"),
    (
        "unknown role",
        dict(messages=[{"role": "wizard", "content": "hi"}]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "role",
    ),
    (
        "max_tokens 0",
        dict(prompt="hi", max_tokens=0),
        grpc.StatusCode.INVALID_ARGUMENT,
        "max_tokens",
    ),
    (
        "max_tokens -5",
        dict(prompt="hi", max_tokens=-5),
        grpc.StatusCode.INVALID_ARGUMENT,
        "max_tokens",
    ),
    (
        "temperature < 0",
        dict(prompt="hi", temperature=-0.5),
        grpc.StatusCode.INVALID_ARGUMENT,
        "temperature",
    ),
    ("top_p 0", dict(prompt="hi", top_p=0.0), grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
    ("top_p > 1", dict(prompt="hi", top_p=1.5), grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
    (
        "token id out of vocab",
        dict(token_ids=[1, 49152]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "token_ids",
    ),
    (
        "prompt over the context",
        dict(token_ids=[42] * 8192),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "prompt",
    ),
]


@pytest.mark.parametrize(
    ("name", "kwargs", "code", "field"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_is_rejected_precisely(
    client: Client, name: str, kwargs: dict[str, object], code: grpc.StatusCode, field: str
) -> None:
    """The real gateway's status and message, as the client raises them."""
    with pytest.raises(grpc.RpcError) as err:
        client.complete("bad-input", timeout_s=30, **kwargs)
    assert err.value.code() == code, err.value.details()
    assert field in err.value.details()


@pytest.mark.parametrize("session_id", ["x" * 129, "tab\there", "new\nline", "nul\x00"])
def test_bad_session_ids_are_rejected(client: Client, session_id: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.complete(session_id, prompt="hi", max_tokens=2, timeout_s=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "session_id" in err.value.details()


def test_bad_input_disturbs_no_one(
    client: Client, model: Model, cluster: Cluster, redis: redis_lib.Redis
) -> None:
    messages = [{"role": "user", "content": "Name three fruits."}]
    stream = client.stream("healthy", messages=messages, max_tokens=NEW_TOKENS)
    for _, kwargs, _, _ in BAD_INPUTS:
        with pytest.raises(grpc.RpcError):
            client.complete("healthy", timeout_s=30, **kwargs)  # type: ignore[arg-type]
    reply = collect(stream)
    assert reply.token_ids == reference(model, messages, NEW_TOKENS)[1]
    for w in cluster.worker_ids:  # no worker died or restarted
        assert worker_status(redis, w)["pid"] == cluster.processes[w].pid


def test_session_id_from_metadata_and_delete(client: Client) -> None:
    reply = client.complete(
        "", prompt="Hello", max_tokens=3, metadata=[("x-session-id", "from-metadata")]
    )
    assert reply.completion.usage.completion_tokens >= 1
    # the session's record follows the worker's event, which may land after the reply
    wait_for(lambda: client.get_session("from-metadata").num_tokens > 0, "its tokens indexed")
    assert client.delete_session("from-metadata") is True
    with pytest.raises(grpc.RpcError) as err:
        client.get_session("from-metadata")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert client.delete_session("from-metadata") is False


def test_fork_session_continues_independently(client: Client, model: Model) -> None:
    base = [{"role": "user", "content": "Name a large animal."}]
    first = client.complete("trunk", messages=base, max_tokens=NEW_TOKENS)
    fork = client.fork_session("trunk", "branch")
    assert fork.session_id == "branch" and fork.worker_id == first.completion.worker_id
    history = [*base, {"role": "assistant", "content": first.text}]
    for sid, follow_up in (("trunk", "Where does it live?"), ("branch", "What does it eat?")):
        messages = [*history, {"role": "user", "content": follow_up}]
        reply = client.complete(sid, messages=messages, max_tokens=NEW_TOKENS)
        assert reply.token_ids == reference(model, messages, NEW_TOKENS)[1], sid
        assert reply.completion.kv_source == pb.KV_SOURCE_WARM, sid
        assert reply.completion.usage.cached_tokens >= len(first.token_ids) + 30, sid
        assert reply.completion.worker_id == first.completion.worker_id
    for source, new, code in (
        ("no-such", "x", grpc.StatusCode.NOT_FOUND),
        ("trunk", "branch", grpc.StatusCode.ALREADY_EXISTS),
        ("trunk", "", grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(grpc.RpcError) as err:
            client.fork_session(source, new)
        assert err.value.code() == code
