"""Requests a gRPC server refuses before its handlers see them (RequestGuard for grpc.aio,
SyncRequestGuard for a thread-pool server): bytes that do not decode answer INVALID_ARGUMENT
(gRPC alone answers INTERNAL and logs a traceback per call), and an encoded request over its
method's size bound answers RESOURCE_EXHAUSTED, decided from the size alone, without
decoding it. Undecodable requests are logged as one line with a running count, at most
every LOG_EVERY_S. SyncCallLimit bounds a thread-pool server's open calls with a status
that says so (gRPC's own bound answers "Concurrent RPC limit exceeded!", health checks
included)."""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

log = logging.getLogger("warmfleet.grpc")
LOG_EVERY_S = 10.0
RETRY_AFTER_MS = 1000  # a refused call's hint: open calls end at their clients' pace
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


class SyncCallLimit(grpc.ServerInterceptor):
    """Bounds the open calls of a thread-pool server's own services (not health or
    reflection, so a server at its limit still says it is healthy): one more is refused
    RESOURCE_EXHAUSTED with a `retry-after-ms` trailer. Counted where the call runs, on
    the pool's thread: a call cancelled while it waited for one never ran."""

    def __init__(self, max_open: int, services: Iterable[str]) -> None:
        self.max_open = max_open
        self.services = list(services)
        self.num_open = 0
        self.num_refused = 0
        self._prefixes = tuple(f"/{name}/" for name in self.services)
        self._lock = threading.Lock()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = continuation(details)
        if handler is None or not details.method.startswith(self._prefixes):
            return handler
        for kind in ("unary_unary", "stream_unary"):
            if (behavior := getattr(handler, kind)) is not None:
                return handler._replace(**{kind: self._bounded(behavior)})
        kind = "unary_stream" if handler.unary_stream is not None else "stream_stream"
        return handler._replace(**{kind: self._bounded_stream(getattr(handler, kind))})

    def _bounded(self, behavior: Behavior) -> Behavior:
        def bounded(request: Any, context: grpc.ServicerContext) -> Any:
            self._admit(context)
            try:
                return behavior(request, context)
            finally:
                self._leave()

        return bounded

    def _bounded_stream(self, behavior: Behavior) -> Behavior:
        def bounded(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            self._admit(context)
            try:
                yield from behavior(request, context)
            finally:
                self._leave()

        return bounded

    def _admit(self, context: grpc.ServicerContext) -> None:
        """Count the call open, or end it RESOURCE_EXHAUSTED (raises) if that would pass
        the limit."""
        with self._lock:
            if self.num_open < self.max_open:
                self.num_open += 1
                return
            self.num_refused += 1
        who = " and ".join(self.services)
        context.set_trailing_metadata((("retry-after-ms", str(RETRY_AFTER_MS)),))
        context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{who} has {self.max_open} calls open, its limit; retry after {RETRY_AFTER_MS} ms",
        )

    def _leave(self) -> None:
        with self._lock:
            self.num_open -= 1


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
