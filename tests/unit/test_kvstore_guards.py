"""The kvstore's gRPC face against bad input and too many calls (common/grpc_guard.py's
SyncRequestGuard and SyncCallLimit on its thread-pool server, kvstore/grpc_service.py's
checks): undecodable, oversized and misnamed requests and calls past the limit get a precise
status, the service goes on answering, and Redis is not touched by them. A real in-process
server over loopback, a real Redis."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import grpc
import pytest
import redis as redis_lib
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker import keys
from common.grpc_guard import SyncRequestGuard
from common.grpc_serve import serve
from common.v1 import kvstore_pb2 as pb
from common.v1 import kvstore_pb2_grpc
from kvstore.grpc_service import MAX_REQUEST_BYTES, SERVICE_NAME, KVStoreService, size_checks
from kvstore.service import KVStore
from tests.cluster_fixtures import decoded_client, redis_client, redis_server  # noqa: F401
from tests.cluster_helpers import wait_for

EVICT = f"/{SERVICE_NAME}/Evict"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
MAX_CALLS = 4  # the server's limit on open calls here (`warmfleet kvstore`: 16)


class Served(NamedTuple):
    channel: grpc.Channel
    guard: SyncRequestGuard
    store: KVStore


@pytest.fixture(name="kv")
def kv_server(decoded: redis_lib.Redis, tmp_path: Path) -> Iterator[Served]:
    """The kvstore's gRPC service as `warmfleet kvstore` serves it (its loop not running:
    a command waits until the test steps it)."""
    store = KVStore(decoded, tmp_path / "spill", disk_budget=None, block_ms=10)
    store.start()
    guard = SyncRequestGuard(size_checks())
    add = kvstore_pb2_grpc.add_KVStoreServicer_to_server
    service = [(add, KVStoreService(store), SERVICE_NAME)]
    server, port, _ = serve(service, "127.0.0.1:0", MAX_CALLS, guard=guard)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Served(channel, guard, store)
    finally:
        channel.close()
        server.stop(0)


def status_of(call: object) -> tuple[grpc.StatusCode, str]:
    """The status a call ends with (it must fail)."""
    assert callable(call)
    with pytest.raises(grpc.RpcError) as err:
        result = call()
        if hasattr(result, "__iter__"):
            list(result)  # a streamed answer fails while it is read
    e = err.value
    assert isinstance(e, grpc.Call)
    return e.code(), e.details() or ""


def test_undecodable_requests_are_invalid_argument_logged_once_and_the_service_goes_on(
    kv: Served,
    decoded: redis_lib.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    channel, guard, _ = kv
    before = sorted(decoded.keys("*"))
    calls = [
        lambda: channel.unary_unary(EVICT)(b"\xff\xff\xff", timeout=10),  # corrupt
        lambda: channel.unary_unary(EVICT)(b"\x0a\x05ab", timeout=10),  # short
        lambda: channel.unary_unary("/grpc.health.v1.Health/Check")(b"\xff", timeout=10),
        lambda: channel.unary_stream("/grpc.health.v1.Health/Watch")(b"\xff", timeout=10),
        lambda: channel.stream_stream(REFLECTION)(iter([b"\xff\xff"]), timeout=10),
    ]
    with caplog.at_level(logging.INFO):
        statuses = [status_of(c) for c in calls]
    assert [code for code, _ in statuses] == [grpc.StatusCode.INVALID_ARGUMENT] * 5
    assert all("the request's bytes do not decode" in message for _, message in statuses)
    assert guard.num_undecodable == 5
    lines = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert len(lines) == 1 and "to /warmfleet.v1.KVStore/Evict" in lines[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)  # gRPC logged no traceback
    # still serving, every part: its own method, health, reflection
    usage = kvstore_pb2_grpc.KVStoreStub(channel).GetUsage(pb.GetUsageRequest(), timeout=10)
    assert usage.disk.budget_bytes == 0 and not usage.workers
    health = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10
    )
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert sorted(decoded.keys("*")) == before


def test_an_oversized_request_is_refused_from_its_size(
    kv: Served,
) -> None:
    channel, guard, _ = kv
    big = pb.EvictRequest(session_id="s" * 2000).SerializeToString()
    code, message = status_of(lambda: channel.unary_unary(EVICT)(big, timeout=10))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert message == (
        f"the request is {len(big)} bytes; warmfleet.v1.KVStore's are at most {MAX_REQUEST_BYTES}"
    )
    # far past its bound: refused unread, so not counted as undecodable either
    huge = b"\xff" * (MAX_REQUEST_BYTES + 1)
    code, _ = status_of(lambda: channel.unary_unary(EVICT)(huge, timeout=10))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and guard.num_undecodable == 0


@pytest.mark.parametrize(
    ("tenant", "session_id", "expected"),
    [
        ("a/b", "s", "tenant: must be 1-64 of A-Z a-z 0-9 _ . - (got 'a/b')"),  # joins keys
        ("x:y", "s", "tenant: must be 1-64 of A-Z a-z 0-9 _ . - (got 'x:y')"),
        ("t" * 65, "s", "tenant: must be 1-64"),
        ("alice", "", "session_id: is required"),
        ("alice", "a\x00b", "session_id: contains control character U+0000"),
    ],
)
def test_a_misnamed_session_is_invalid_before_redis(
    kv: Served,
    decoded: redis_lib.Redis,
    tenant: str,
    session_id: str,
    expected: str,
) -> None:
    channel, _, _ = kv
    before = sorted(decoded.keys("*"))
    request = pb.EvictRequest(session_id=session_id, tenant=tenant)
    stub = kvstore_pb2_grpc.KVStoreStub(channel)
    code, message = status_of(lambda: stub.Evict(request, timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith(expected)
    assert sorted(decoded.keys("*")) == before  # no command went out


def test_calls_past_the_limit_are_refused_with_a_retry_hint_while_health_answers(
    kv: Served, decoded: redis_lib.Redis
) -> None:
    channel, _, store = kv
    stub = kvstore_pb2_grpc.KVStoreStub(channel)
    evict = pb.EvictRequest(session_id="nobody")
    waiting = [stub.Evict.future(evict, timeout=30) for _ in range(MAX_CALLS)]
    # each is open once its command is on the stream: it waits there for the kvstore
    wait_for(lambda: decoded.xlen(keys.KV_EVENTS) == MAX_CALLS, "the calls to be open")
    refused = [status_of(lambda: stub.Evict(evict, timeout=10)) for _ in range(3)]
    refused.append(status_of(lambda: stub.GetUsage(pb.GetUsageRequest(), timeout=10)))
    expected = f"{SERVICE_NAME} has {MAX_CALLS} calls open, its limit; retry after 1000 ms"
    assert refused == [(grpc.StatusCode.RESOURCE_EXHAUSTED, expected)] * 4
    with pytest.raises(grpc.RpcError) as err:
        stub.Evict(evict, timeout=10)
    assert isinstance(err.value, grpc.Call)
    assert dict(err.value.trailing_metadata() or ())["retry-after-ms"] == "1000"
    health = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10
    )
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert decoded.xlen(keys.KV_EVENTS) == MAX_CALLS  # the refused sent no command
    assert store.step(block=False) == MAX_CALLS  # the kvstore answers the open ones
    for call in waiting:
        assert status_of(call.result)[0] == grpc.StatusCode.NOT_FOUND
    # their slots are free again
    assert stub.GetUsage(pb.GetUsageRequest(), timeout=10).disk.budget_bytes == 0
    call = stub.Evict.future(evict, timeout=30)
    wait_for(lambda: decoded.xlen(keys.KV_EVENTS) == 1, "the next call to be open")
    assert store.step(block=False) == 1
    assert status_of(call.result)[0] == grpc.StatusCode.NOT_FOUND
