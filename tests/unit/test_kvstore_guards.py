"""The kvstore's gRPC face against bad input (common/grpc_guard.py's SyncRequestGuard on its
thread-pool server, kvstore/grpc_service.py's checks): undecodable, oversized and misnamed
requests get a precise status, the service goes on answering, and Redis is not touched by
them. A real in-process server over loopback, a real Redis."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis as redis_lib
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.grpc_guard import SyncRequestGuard
from common.grpc_serve import serve
from common.v1 import kvstore_pb2 as pb
from common.v1 import kvstore_pb2_grpc
from kvstore.grpc_service import MAX_REQUEST_BYTES, SERVICE_NAME, KVStoreService, size_checks
from kvstore.service import KVStore
from tests.cluster_fixtures import decoded_client, redis_client, redis_server  # noqa: F401

EVICT = f"/{SERVICE_NAME}/Evict"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


@pytest.fixture(name="kv")
def kv_server(
    decoded: redis_lib.Redis, tmp_path: Path
) -> Iterator[tuple[grpc.Channel, SyncRequestGuard]]:
    """The kvstore's gRPC service as `warmfleet kvstore` serves it (its loop not running:
    nothing here gets as far as a command)."""
    store = KVStore(decoded, tmp_path / "spill", disk_budget=None, block_ms=10)
    store.start()
    guard = SyncRequestGuard(size_checks())
    add = kvstore_pb2_grpc.add_KVStoreServicer_to_server
    server, port, _ = serve([(add, KVStoreService(store), SERVICE_NAME)], "127.0.0.1:0", 4,
                            guard=guard)  # fmt: skip
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel, guard
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
    kv: tuple[grpc.Channel, SyncRequestGuard],
    decoded: redis_lib.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    channel, guard = kv
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
    kv: tuple[grpc.Channel, SyncRequestGuard],
) -> None:
    channel, guard = kv
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
    kv: tuple[grpc.Channel, SyncRequestGuard],
    decoded: redis_lib.Redis,
    tenant: str,
    session_id: str,
    expected: str,
) -> None:
    channel, _ = kv
    before = sorted(decoded.keys("*"))
    request = pb.EvictRequest(session_id=session_id, tenant=tenant)
    stub = kvstore_pb2_grpc.KVStoreStub(channel)
    code, message = status_of(lambda: stub.Evict(request, timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith(expected)
    assert sorted(decoded.keys("*")) == before  # no command went out
