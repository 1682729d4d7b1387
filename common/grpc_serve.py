"""Start a gRPC server with the standard health and reflection services beside ours."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from common.grpc_guard import RequestGuard, SyncCallLimit, SyncRequestGuard

# (add_XServicer_to_server, the servicer, the service's full name)
Service = tuple[Callable[[Any, grpc.Server], None], Any, str]
DEFAULT_MAX_MESSAGE_BYTES = 4 << 20  # gRPC's own default
# threads beyond a thread-pool server's call limit: health checks, reflection and the
# refusals of calls past the limit run on them while our services' calls fill the rest
SPARE_THREADS = 4


def serve(
    services: list[Service],
    address: str,
    max_workers: int,
    *,
    serving: bool = True,
    guard: SyncRequestGuard | None = None,
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """A started server bound to `address` ("host:port", port 0 picks one), reporting
    SERVING (or NOT_SERVING) for the overall service "" and each of ours; returns it, its
    port and its health servicer (to change that). Raises OSError if it cannot bind.

    At most `max_workers` calls of our services run at once: one more is refused
    RESOURCE_EXHAUSTED, naming the limit, with a `retry-after-ms` trailer (SyncCallLimit);
    health and reflection answer meanwhile on SPARE_THREADS threads of their own (past
    those too, gRPC refuses a call itself). `guard` answers undecodable requests
    INVALID_ARGUMENT and applies its per-method size bounds."""
    limit = SyncCallLimit(max_workers, [name for _, _, name in services])
    threads = max_workers + SPARE_THREADS
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads),
        interceptors=[limit, guard or SyncRequestGuard()],
        maximum_concurrent_rpcs=threads,
    )
    health_servicer = health.HealthServicer()
    names, port = _register(server, services, health_servicer, address)
    set_health(health_servicer, ["", *names], serving)
    server.start()
    return server, port, health_servicer


async def serve_async(
    services: list[Service],
    address: str,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    guard: RequestGuard | None = None,
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """`serve` for servicers written with grpc.aio: on the caller's event loop, no thread
    per call. Starts NOT_SERVING; returns the server, its port and its health servicer.

    A request message over `max_message_bytes` is refused by gRPC itself (RESOURCE_EXHAUSTED,
    "Received message larger than max"; slowly: 0.1-3 s measured here for 5 MB, where the
    guard's size bounds answer in milliseconds); `guard` (innermost of the interceptors)
    answers undecodable requests INVALID_ARGUMENT and applies its per-method size bounds."""
    server = grpc.aio.server(
        interceptors=[*interceptors, guard or RequestGuard()],
        options=[("grpc.max_receive_message_length", max_message_bytes)],
    )
    health_servicer = health.aio.HealthServicer()
    names, port = _register(server, services, health_servicer, address)
    for name in ("", *names):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.start()
    return server, port, health_servicer


def _register(
    server: Any, services: list[Service], health_servicer: Any, address: str
) -> tuple[list[str], int]:
    """Add our services, health and reflection to `server` (sync or aio) and bind it; our
    services' names and the port. Raises OSError if it cannot bind."""
    for add, servicer, _ in services:
        add(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [name for _, _, name in services]
    reflection.enable_server_reflection(
        (*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return names, port


def set_health(servicer: health.HealthServicer, names: list[str], serving: bool) -> None:
    status = health_pb2.HealthCheckResponse
    for name in names:
        servicer.set(name, status.SERVING if serving else status.NOT_SERVING)


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """End the call with `code` and `message` (typed NoReturn, which context.abort is not)."""
    context.abort(code, message)
    raise AssertionError("unreachable")  # context.abort raises
