"""The gateway's guards, each alone: the bounded lane for expensive steps (gateway/work_gate.py),
undecodable and oversized gRPC requests (common/grpc_guard.py, on a real in-process server),
the open-call limits of both faces, Redis errors as statuses (gateway/core.py), and the local
tenant's limits as flags."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
import redis

from common.errors import InternalError, InvalidRequestError, QueueFullError, UnavailableError
from common.grpc_guard import RequestGuard
from common.grpc_serve import serve_async
from common.v1 import inference_pb2 as pb
from common.v1 import inference_pb2_grpc
from gateway.auth import KeyRing, Tenant
from gateway.core import GatewayConfig, GatewayCore, redis_failure
from gateway.grpc_calls import CountStatuses
from gateway.http_app import CountResponses
from gateway.metrics import GatewayMetrics
from gateway.work_gate import WorkGate
from warmfleet.cli import main
from warmfleet.cluster_config import ClusterConfig

GENERATE = "/warmfleet.v1.Inference/Generate"
GET_SESSION = "/warmfleet.v1.Inference/GetSession"


def test_the_gate_refuses_once_too_many_bytes_wait() -> None:
    async def scenario() -> list[object]:
        gate = WorkGate(max_running=1, max_waiting_bytes=100)
        release = threading.Event()
        running = asyncio.ensure_future(gate.run(10, release.wait, 30))
        await asyncio.sleep(0)  # it holds the one slot
        waiting = asyncio.ensure_future(gate.run(60, lambda: "second"))
        await asyncio.sleep(0)
        assert (gate.num_waiting, gate.waiting_bytes) == (1, 60)
        with pytest.raises(QueueFullError) as err:
            await gate.run(60, lambda: "third")
        assert err.value.retry_after_ms >= 1000
        assert "1 requests, 60 bytes; the gateway holds at most 100" in str(err.value)
        small = asyncio.ensure_future(gate.run(40, lambda: "small"))  # 100 fits
        release.set()
        results = await asyncio.gather(running, waiting, small)
        gate.close()
        return [*results, gate.num_refused]

    assert asyncio.run(scenario()) == [True, "second", "small", 1]


def test_a_slot_frees_when_its_work_ends_not_when_its_caller_leaves() -> None:
    async def scenario() -> None:
        gate = WorkGate(max_running=1, max_waiting_bytes=1 << 20)
        release = threading.Event()
        first = asyncio.ensure_future(gate.run(10, release.wait, 30))
        await asyncio.sleep(0.01)
        first.cancel()  # the client went away; its tokenizing still runs
        await asyncio.sleep(0.01)
        second = asyncio.ensure_future(gate.run(10, lambda: "second"))
        await asyncio.sleep(0.05)
        assert not second.done() and gate.num_waiting == 1
        release.set()
        assert await second == "second"
        gate.close()

    asyncio.run(scenario())


class Inference(inference_pb2_grpc.InferenceServicer):
    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        yield pb.GenerateResponse(chunk=pb.Chunk(index=0, text=request.prompt))

    async def GetSession(
        self, request: pb.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.Session:
        await asyncio.sleep(float(request.session_id or 0))
        return pb.Session(session_id=request.session_id)


async def serve(guard: RequestGuard, max_open: int = 10) -> tuple[grpc.aio.Server, str]:
    add = inference_pb2_grpc.add_InferenceServicer_to_server
    server, port, _ = await serve_async(
        [(add, Inference(), "warmfleet.v1.Inference")], "127.0.0.1:0",
        [CountStatuses(GatewayMetrics(), max_open)], guard=guard,
    )  # fmt: skip
    return server, f"127.0.0.1:{port}"


async def call_raw(target: str, method: str, raw: bytes, stream: bool) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(target) as channel:
        if stream:
            call: Any = channel.unary_stream(method)(raw, timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in call:
                    pass
        else:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_unary(method)(raw, timeout=10)
    return err.value


def test_undecodable_bytes_are_invalid_argument_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    guard = RequestGuard()

    async def scenario() -> list[grpc.aio.AioRpcError]:
        server, target = await serve(guard)
        try:
            bad = [b"\xff\xff\xff", b"\x0a\x05ab", b"\x12\x02\xc3\x28"]  # corrupt; short; not UTF-8
            errors = [await call_raw(target, GENERATE, raw, True) for raw in bad]
            errors.append(await call_raw(target, GET_SESSION, b"\xff", False))
            return errors
        finally:
            await server.stop(0)

    with caplog.at_level(logging.INFO):
        errors = asyncio.run(scenario())
    assert [e.code() for e in errors] == [grpc.StatusCode.INVALID_ARGUMENT] * 4
    assert all("do not decode" in (e.details() or "") for e in errors)
    assert guard.num_undecodable == 4
    lines = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert len(lines) == 1 and "1 undecodable requests so far" in lines[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)  # no traceback


def test_an_oversized_request_is_refused_unread() -> None:
    checked: list[int] = []

    def check(num_bytes: int) -> str | None:
        checked.append(num_bytes)
        return "too large: the limit is 100 bytes" if num_bytes > 100 else None

    async def scenario() -> tuple[grpc.aio.AioRpcError, list[str]]:
        server, target = await serve(RequestGuard({GENERATE: check}))
        try:
            raw = pb.GenerateRequest(prompt="x" * 200).SerializeToString()
            error = await call_raw(target, GENERATE, raw, True)
            async with grpc.aio.insecure_channel(target) as channel:
                stub = inference_pb2_grpc.InferenceStub(channel)
                texts = [r.chunk.text async for r in stub.Generate(pb.GenerateRequest(prompt="hi"))]
            return error, texts
        finally:
            await server.stop(0)

    error, texts = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.details() == "too large: the limit is 100 bytes"
    assert texts == ["hi"] and checked[0] == 203


def test_a_call_past_the_open_limit_gets_a_retry_hint() -> None:
    async def scenario() -> grpc.aio.AioRpcError:
        server, target = await serve(RequestGuard(), max_open=1)
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                stub = inference_pb2_grpc.InferenceStub(channel)
                slow = asyncio.ensure_future(stub.GetSession(pb.GetSessionRequest(session_id="1")))
                await asyncio.sleep(0.3)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.GetSession(pb.GetSessionRequest(session_id="0"))
                assert (await slow).session_id == "1"
                return err.value
        finally:
            await server.stop(0)

    error = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-streams" in (error.details() or "")
    assert dict(error.trailing_metadata() or ())["retry-after-ms"] == "1000"


def test_redis_errors_caused_by_a_command_are_internal_not_unavailable() -> None:
    refused = redis_failure(redis.ResponseError("value is not an integer or out of range"))
    assert isinstance(refused, InternalError) and "not an integer" in str(refused)
    for passing in [
        redis.ConnectionError("Connection refused"),
        redis.TimeoutError("Timeout reading"),
        redis.exceptions.BusyLoadingError("Redis is loading"),
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"),
        redis.ResponseError("BUSY Redis is busy running a script"),
    ]:
        assert isinstance(redis_failure(passing), UnavailableError), passing


@pytest.mark.parametrize("token", ["9223372036854775807", "1234567890", "²", "-1", "1 ", "x"])
def test_a_page_token_we_did_not_issue_is_invalid_before_redis(token: str) -> None:
    core = GatewayCore(None, None, GatewayConfig(), None)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match=r"^page_token: "):
        asyncio.run(core.list_sessions("local", token, 10))


def test_an_http_request_past_the_open_limit_gets_429_with_retry_after() -> None:
    async def ok(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def scenario() -> list[httpx.Response]:
        app = CountResponses(ok, GatewayMetrics(), max_open=0)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            return [await c.post("/v1/messages", json={}), await c.get("/metrics")]

    refused, scrape = asyncio.run(scenario())
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "rate_limit_error"  # the Anthropic shape
    assert "--max-streams" in refused.json()["error"]["message"]
    assert scrape.status_code == 200  # not an API request: not bounded


def test_the_local_tenants_limits_come_from_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert KeyRing.open(3, 5).tenant([]) == Tenant(
        "local", max_concurrent=3, max_queued=5, local=True
    )
    argv = ClusterConfig(local_max_concurrent=1, local_max_queued=2).gateway_argv(1, 2, "redis://x")
    assert argv[-4:] == ["--local-max-concurrent", "1", "--local-max-queued", "2"]
    for command in ("gateway", "up"):
        with pytest.raises(SystemExit) as exit_:
            main([command, "--local-max-queued", "0"])
        assert exit_.value.code == 2
        assert "--local-max-queued: must be at least 1, got 0" in capsys.readouterr().err
