"""Requests a gRPC server refuses before its handlers see them (RequestGuard for grpc.aio,
SyncRequestGuard for a thread-pool server): bytes that do not decode answer INVALID_ARGUMENT
(gRPC alone answers INTERNAL and logs a traceback per call), and an encoded request over its
method's size bound answers RESOURCE_EXHAUSTED, decided from the size alone, without
decoding it. Undecodable requests are logged as one line with a running count, at most
every LOG_EVERY_S."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

log = logging.getLogger("warmfleet.grpc")
LOG_EVERY_S = 10.0
SizeCheck = Callable[[int], str | None]  # an encoded request's bytes -> why it is refused
Behavior = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Refused:
    """What a guarded deserializer returns instead of a request: the call's status."""

    code: grpc.StatusCode
    message: str


class _Decoding:
    """What both guards share: the deserializer that answers Refused instead of raising."""

    def __init__(self, size_checks: Mapping[str, SizeCheck] | None = None) -> None:
        self.size_checks = dict(size_checks or {})  # by full method name, "/pkg.Service/M"
        self.num_undecodable = 0
        self._logged_at = -LOG_EVERY_S

    def _decoder(self, method: str, deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
        check = self.size_checks.get(method)

        def decode(raw: bytes) -> Any:
            if check is not None and (why := check(len(raw))) is not None:
                return Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
            try:
                return deserialize(raw)
            except Exception as e:  # whatever the deserializer raises on bad bytes
                self._undecodable(method, e)
                return Refused(grpc.StatusCode.INVALID_ARGUMENT,
                               f"the request's bytes do not decode: {str(e)[:200]}")  # fmt: skip

        return decode

    def _undecodable(self, method: str, error: Exception) -> None:
        self.num_undecodable += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            log.warning("%d undecodable requests so far, each answered INVALID_ARGUMENT "
                        "(the latest, to %s: %s)", self.num_undecodable, method,
                        str(error)[:200])  # fmt: skip


class RequestGuard(_Decoding, grpc.aio.ServerInterceptor):
    """The guard of a grpc.aio server."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        decode = self._decoder(details.method, handler.request_deserializer)
        if handler.unary_unary is not None:
            return handler._replace(request_deserializer=decode,
                                    unary_unary=_unary(handler.unary_unary))  # fmt: skip
        if handler.unary_stream is not None:
            guarded = _unary_stream(handler.unary_stream)
            return handler._replace(request_deserializer=decode, unary_stream=guarded)
        kind = "stream_unary" if handler.stream_unary is not None else "stream_stream"
        behavior = getattr(handler, kind)
        if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
            return handler  # a handler reading another way: left as gRPC serves it
        return handler._replace(request_deserializer=decode, **{kind: _stream_in(behavior)})


class SyncRequestGuard(_Decoding, grpc.ServerInterceptor):
    """The guard of a thread-pool server (grpc.server): the same answers."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        decode = self._decoder(details.method, handler.request_deserializer)
        for kind in ("unary_unary", "unary_stream"):
            if (behavior := getattr(handler, kind)) is not None:
                return handler._replace(request_deserializer=decode, **{kind: _sync_one(behavior)})
        kind = "stream_unary" if handler.stream_unary is not None else "stream_stream"
        guarded = _sync_many(getattr(handler, kind))
        return handler._replace(request_deserializer=decode, **{kind: guarded})


def _sync_one(behavior: Behavior) -> Behavior:
    def guarded(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Refused):
            context.abort(request.code, request.message)  # raises
        return behavior(request, context)

    return guarded


def _sync_many(behavior: Behavior) -> Behavior:
    def checked(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        for request in requests:
            if isinstance(request, Refused):
                context.abort(request.code, request.message)
            yield request

    def guarded(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        return behavior(checked(requests, context), context)

    return guarded


async def _refuse(refused: Refused, context: grpc.aio.ServicerContext) -> None:
    await context.abort(refused.code, refused.message)


def _unary(behavior: Behavior) -> Behavior:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Refused):
            await _refuse(request, context)
        result = behavior(request, context)
        return await result if inspect.isawaitable(result) else result

    return guarded


def _unary_stream(behavior: Behavior) -> Behavior:
    if inspect.iscoroutinefunction(behavior):  # it writes its responses with context.write

        async def guarded_writer(request: Any, context: grpc.aio.ServicerContext) -> None:
            if isinstance(request, Refused):
                await _refuse(request, context)
            await behavior(request, context)

        return guarded_writer

    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, Refused):
            await _refuse(request, context)
        responses = behavior(request, context)
        if hasattr(responses, "__aiter__"):
            async for response in responses:
                yield response
        else:
            for response in responses:
                yield response

    return guarded


def _stream_in(behavior: Behavior) -> Behavior:
    async def checked(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, Refused):
                await _refuse(request, context)
            yield request

    if inspect.isasyncgenfunction(behavior):

        async def guarded(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for response in behavior(checked(requests, context), context):
                yield response

        return guarded

    async def guarded_call(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        return await behavior(checked(requests, context), context)

    return guarded_call
