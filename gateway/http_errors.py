"""The named errors as HTTP statuses, in the shape each API's clients expect:
OpenAI `{"error": {"message", "type", "param", "code"}}`, Anthropic
`{"type": "error", "error": {"type", "message"}}`."""

from __future__ import annotations

import enum
import math

from starlette.responses import JSONResponse

from common import errors as e

# (error class, HTTP status, OpenAI type and code, Anthropic type); the first match wins
TABLE: list[tuple[type[Exception], int, str, str, str]] = [
    (e.PromptTooLongError, 400, "invalid_request_error", "context_length_exceeded",
     "invalid_request_error"),
    (e.PromptTooLargeError, 400, "invalid_request_error", "context_length_exceeded",
     "invalid_request_error"),
    (e.InvalidRequestError, 400, "invalid_request_error", "invalid_value",
     "invalid_request_error"),
    (e.UnauthenticatedError, 401, "authentication_error", "invalid_api_key",
     "authentication_error"),
    (e.PermissionDeniedError, 403, "permission_error", "permission_denied", "permission_error"),
    (e.NotFoundError, 404, "invalid_request_error", "not_found", "not_found_error"),
    (e.AlreadyExistsError, 409, "invalid_request_error", "already_exists",
     "invalid_request_error"),
    (e.FailedPreconditionError, 409, "invalid_request_error", "failed_precondition",
     "invalid_request_error"),
    (e.PayloadTooLargeError, 413, "invalid_request_error", "request_too_large",
     "request_too_large"),
    (e.QueueFullError, 429, "rate_limit_error", "rate_limit_exceeded", "rate_limit_error"),
    (e.DeadlineExceededError, 504, "timeout", "deadline_exceeded", "api_error"),
    (e.ServiceError, 503, "server_error", "service_unavailable", "overloaded_error"),
]  # fmt: skip
JOB_STATUS = {  # a worker's error (a gRPC status name) as HTTP
    "INVALID_ARGUMENT": 400, "RESOURCE_EXHAUSTED": 400, "DEADLINE_EXCEEDED": 504,
    "UNAVAILABLE": 503,
}  # fmt: skip


class Shape(enum.Enum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


def describe(error: e.WarmfleetError) -> tuple[int, str, str, str]:
    """(status, OpenAI type, OpenAI code, Anthropic type) of an error."""
    if isinstance(error, e.JobFailedError):
        status = JOB_STATUS.get(error.code, 500)
        kind = "invalid_request_error" if status == 400 else "server_error"
        return (
            status,
            kind,
            error.code.lower(),
            "invalid_request_error" if status == 400 else "api_error",
        )
    for cls, status, kind, code, anthropic in TABLE:
        if isinstance(error, cls):
            return status, kind, code, anthropic
    return 500, "server_error", "internal_error", "api_error"


def error_body(error: e.WarmfleetError, shape: Shape) -> dict[str, object]:
    _, kind, code, anthropic = describe(error)
    if shape is Shape.ANTHROPIC:
        return {"type": "error", "error": {"type": anthropic, "message": str(error)}}
    param = error.field if isinstance(error, e.InvalidRequestError) else None
    return {"error": {"message": str(error), "type": kind, "param": param, "code": code}}


def error_response(
    error: e.WarmfleetError, shape: Shape, headers: dict[str, str] | None = None
) -> JSONResponse:
    status = describe(error)[0]
    headers = dict(headers or {})
    if isinstance(error, e.QueueFullError):
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_ms / 1000)))
    return JSONResponse(error_body(error, shape), status_code=status, headers=headers)


def bug_response(shape: Shape) -> JSONResponse:
    """The 500 for an exception no handler expected (a bug in the gateway, logged where it is
    caught), in the API's shape: the client's connection stays open for its next request."""
    error = e.WarmfleetError("the gateway failed on this request (an internal error, logged)")
    return error_response(error, shape)  # no entry of TABLE: 500, server_error / api_error
