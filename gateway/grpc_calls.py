"""The Inference service's calls as a whole: how many are open (at most --max-streams; one
more is refused with RESOURCE_EXHAUSTED and a `retry-after-ms` trailer), and the status each
ended with (metrics)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from common.grpc_guard import RETRY_AFTER_MS
from common.v1 import inference_pb2 as pb
from gateway.metrics import GatewayMetrics


@dataclass
class CallState:
    answered: bool = False  # its completion was sent


class CountStatuses(grpc.aio.ServerInterceptor):
    """Bounds the open calls of the Inference service and counts them by the status they
    ended with."""

    def __init__(self, metrics: GatewayMetrics, max_open: int = 4096) -> None:
        self.metrics = metrics
        self.max_open = max_open
        self.num_open = 0
        self.prefix = f"/{pb.DESCRIPTOR.services_by_name['Inference'].full_name}/"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self.prefix):
            return handler
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(handler.unary_unary))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._stream(handler.unary_stream))
        return handler

    def _unary(self, call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(request: Any, context: grpc.aio.ServicerContext) -> Any:
            with self._counting(context):
                await self._admit(context)
                return await call(request, context)

        return counted

    def _stream(self, call: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        async def counted(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            with self._counting(context) as call_state:
                await self._admit(context)
                async for response in call(request, context):
                    if isinstance(response, pb.GenerateResponse) and response.HasField(
                        "completion"
                    ):
                        call_state.answered = True  # a client may close the call now
                    yield response

        return counted

    async def _admit(self, context: grpc.aio.ServicerContext) -> None:
        """Refuse the call when more than `max_open` are open (this one counted)."""
        if self.num_open > self.max_open:
            context.set_trailing_metadata((("retry-after-ms", str(RETRY_AFTER_MS)),))
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the gateway has {self.max_open} calls open, its limit (--max-streams); "
                f"retry after {RETRY_AFTER_MS} ms",
            )

    @contextmanager
    def _counting(self, context: grpc.aio.ServicerContext) -> Iterator[CallState]:
        """Count the call while open, and with the status it ends with (OK once its
        completion was sent, even if the client closes it before the server's end)."""
        state, ended = CallState(), "OK"
        self.num_open += 1
        try:
            yield state
        except grpc.aio.AbortError:
            ended = "UNKNOWN"  # the status it aborted with, below
            raise
        except (asyncio.CancelledError, GeneratorExit):
            ended = "OK" if state.answered else "CANCELLED"  # the client went away
            raise
        except Exception:
            ended = "UNKNOWN"
            raise
        finally:
            self.num_open -= 1
            code = context.code()
            if not isinstance(code, grpc.StatusCode) or state.answered:
                code = None
            self.metrics.responded("grpc", code.name if code is not None else ended)
