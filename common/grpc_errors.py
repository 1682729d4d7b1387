"""The named errors as gRPC statuses, for every gRPC face (the gateway's, the kvstore's)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import grpc

from common import errors as e
from common.grpc_serve import abort

STATUS: list[tuple[type[Exception], grpc.StatusCode]] = [  # the first match wins
    (e.PromptTooLongError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (e.UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (e.PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (e.NotFoundError, grpc.StatusCode.NOT_FOUND),
    (e.AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (e.FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (e.QueueFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (e.UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (e.ServiceError, grpc.StatusCode.UNAVAILABLE),
]


def fail(context: grpc.ServicerContext, error: e.WarmfleetError) -> NoReturn:
    """End the call with the status of `error` (and a retry hint when it has one)."""
    if isinstance(error, e.JobFailedError):
        abort(context, getattr(grpc.StatusCode, error.code, grpc.StatusCode.INTERNAL), str(error))
    if isinstance(error, e.QueueFullError):
        context.set_trailing_metadata((("retry-after-ms", str(error.retry_after_ms)),))
    code = next((c for t, c in STATUS if isinstance(error, t)), grpc.StatusCode.INTERNAL)
    abort(context, code, str(error))


@contextmanager
def statuses(context: grpc.ServicerContext) -> Iterator[None]:
    """Inside, a named error ends the call with its status."""
    try:
        yield
    except e.WarmfleetError as error:
        fail(context, error)
