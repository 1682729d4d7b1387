"""Client: requests it builds and replies it collects, against an in-process fake gateway."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from common.v1 import inference_pb2 as pb
from tests.fake_cluster import FakeInference, serve
from warmfleet.client import Client, build_request


@pytest.fixture
def fake() -> FakeInference:
    return FakeInference(worker_id="w9")


@pytest.fixture
def client(fake: FakeInference) -> Iterator[Client]:
    server, port = serve(fake)
    try:
        with Client(f"127.0.0.1:{port}", timeout_s=10.0) as c:
            yield c
    finally:
        server.stop(grace=None)


def test_build_request_sets_only_what_is_given() -> None:
    req = build_request("s", messages=[{"role": "user", "content": "hi"}], temperature=0.0)
    assert req.WhichOneof("input") == "messages"
    assert [(m.role, m.content) for m in req.messages.messages] == [("user", "hi")]
    assert req.HasField("temperature") and req.temperature == 0.0  # 0 is a choice, not unset
    for name in ("max_tokens", "top_p", "top_k", "min_p", "seed"):
        assert not req.HasField(name)
    assert req.priority == pb.PRIORITY_UNSPECIFIED


def test_build_request_sends_empty_inputs_as_that_input() -> None:
    assert build_request("s", prompt="").WhichOneof("input") == "prompt"
    assert build_request("s", messages=[]).WhichOneof("input") == "messages"
    assert build_request("s", token_ids=[]).WhichOneof("input") == "token_ids"
    assert build_request("s").WhichOneof("input") is None


def test_build_request_options() -> None:
    req = build_request(
        "s", token_ids=[5, 6], max_tokens=3, seed=2**63, stop=["\n"], priority="interactive"
    )
    assert list(req.token_ids.ids) == [5, 6]
    assert (req.max_tokens, req.seed, list(req.stop)) == (3, 2**63, ["\n"])
    assert req.priority == pb.PRIORITY_INTERACTIVE
    assert build_request("s", prompt="x", priority=pb.PRIORITY_BATCH).priority == pb.PRIORITY_BATCH
    with pytest.raises(ValueError, match="at most one"):
        build_request("s", prompt="x", token_ids=[1])


def test_complete_joins_chunks_in_order(client: Client) -> None:
    reply = client.complete("s1", messages=[{"role": "user", "content": "hello world"}])
    assert reply.text == "echo: hello world"
    assert reply.token_ids == [ord(c) for c in "echo: hello world"]
    assert [c.index for c in reply.chunks] == list(range(0, len(reply.text), 4))
    assert reply.completion.worker_id == "w9"
    assert reply.completion.finish_reason == pb.FINISH_REASON_STOP
    assert reply.completion.usage.completion_tokens == len(reply.token_ids)


def test_complete_passes_options_and_metadata(client: Client, fake: FakeInference) -> None:
    reply = client.complete("", prompt="abc", max_tokens=4, metadata=[("x-session-id", "meta")])
    assert reply.text == "echo"
    assert reply.completion.finish_reason == pb.FINISH_REASON_LENGTH
    assert client.get_session("meta").num_tokens == len("abc") + 4
    assert fake.requests[-1].max_tokens == 4


def test_cancel_ends_the_stream(fake: FakeInference, client: Client) -> None:
    fake.chunk_delay_s = 0.2
    call = client.stream("s", prompt="a long enough prompt to take a while")
    first = next(iter(call))
    assert first.chunk.index == 0
    call.cancel()
    with pytest.raises(grpc.RpcError) as err:
        list(call)
    assert err.value.code() == grpc.StatusCode.CANCELLED


def test_sessions_list_follows_pages_and_delete(client: Client) -> None:
    for i in range(5):
        client.complete(f"s{i}", prompt="x")
    assert [s.session_id for s in client.list_sessions(page_size=2)] == [f"s{i}" for i in range(5)]
    assert client.delete_session("s3") is True
    assert client.delete_session("s3") is False
    with pytest.raises(grpc.RpcError) as err:
        client.get_session("s3")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(client.list_sessions()) == 4
