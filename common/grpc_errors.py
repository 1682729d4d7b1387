"""The named errors as gRPC statuses, for every gRPC face (the gateway's, the kvstore's)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import NoReturn

import grpc

from common import errors as e
from common.grpc_serve import abort

STATUS: list[tuple[type[Exception], grpc.StatusCode]] = [  # the first match wins
    (e.PromptTooLongError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.PromptTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (e.UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (e.PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (e.NotFoundError, grpc.StatusCode.NOT_FOUND),
    (e.AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (e.FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (e.QueueFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.PayloadTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (e.UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (e.ServiceError, grpc.StatusCode.UNAVAILABLE),
    (e.InternalError, grpc.StatusCode.INTERNAL),
]


def status_of(error: e.WarmfleetError) -> grpc.StatusCode:
    if isinstance(error, e.JobFailedError):
        code: grpc.StatusCode = getattr(grpc.StatusCode, error.code, grpc.StatusCode.INTERNAL)
        return code
    return next((c for t, c in STATUS if isinstance(error, t)), grpc.StatusCode.INTERNAL)


def trailers_of(error: e.WarmfleetError) -> tuple[tuple[str, str], ...]:
    if isinstance(error, e.QueueFullError):
        return (("retry-after-ms", str(error.retry_after_ms)),)
    return ()


def fail(context: grpc.ServicerContext, error: e.WarmfleetError) -> NoReturn:
    """End the call with the status of `error` (and a retry hint when it has one)."""
    if trailers := trailers_of(error):
        context.set_trailing_metadata(trailers)
    abort(context, status_of(error), str(error))


@contextmanager
def statuses(context: grpc.ServicerContext) -> Iterator[None]:
    """Inside, a named error ends the call with its status."""
    try:
        yield
    except e.WarmfleetError as error:
        fail(context, error)


@asynccontextmanager
async def statuses_async(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
    """`statuses`, for a grpc.aio servicer."""
    try:
        yield
    except e.WarmfleetError as error:
        if trailers := trailers_of(error):
            context.set_trailing_metadata(trailers)
        await context.abort(status_of(error), str(error))
