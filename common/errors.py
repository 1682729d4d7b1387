"""Every named exception of warmfleet, in one place.

The CLI turns any `WarmfleetError` into exit code 2 and a one-line message; the gateway maps
them to gRPC status codes.
"""


class WarmfleetError(Exception):
    """Base of every error that is the caller's to fix (bad input, missing file, bad config)."""


class ModelError(WarmfleetError):
    """The model file cannot be used."""


class ModelNotFoundError(ModelError):
    """The model path does not exist."""


class NotGGUFError(ModelError):
    """The file is not a GGUF file, or it is truncated or malformed."""


class UnsupportedModelError(ModelError):
    """The GGUF file holds an architecture, tensor type or tokenizer this runtime cannot run."""


class ModelFetchError(ModelError):
    """The default model could not be downloaded, unpacked or verified."""


class InvalidRequestError(WarmfleetError):
    """A request field is out of range; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class PromptTooLongError(InvalidRequestError):
    """The prompt (plus max_tokens' minimum of one token) does not fit the model's context."""

    def __init__(self, num_tokens: int, context_length: int) -> None:
        super().__init__(
            "prompt",
            f"{num_tokens} tokens do not fit the context of {context_length} tokens "
            "(one position is kept for the first generated token)",
        )
        self.num_tokens = num_tokens
        self.context_length = context_length


class PromptTooLargeError(InvalidRequestError):
    """The prompt's size alone shows it cannot fit the context: refused before it is
    tokenized (no token covers more bytes than the vocabulary's longest one)."""


class ServiceError(WarmfleetError):
    """A service this command needs could not be started or reached (Redis, a worker)."""


class SpillFileError(WarmfleetError):
    """A spill file failed a check (magic, version, model, layout, size or checksum)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.reason = reason


class ProtocolError(WarmfleetError):
    """A message read from Redis is not one this version understands (unknown kind or
    version, a field missing or of the wrong type)."""


# What a call can end with besides its result; each face (gRPC, HTTP) maps these to its
# own statuses (see gateway/grpc_errors.py).


class UnauthenticatedError(WarmfleetError):
    """No key, or a key the key file does not know."""


class PermissionDeniedError(WarmfleetError):
    """The caller's key does not allow what it asked (a priority above its ceiling)."""


class NotFoundError(WarmfleetError):
    """No such session (or model)."""


class AlreadyExistsError(WarmfleetError):
    """The name is taken (ForkSession's new id)."""


class FailedPreconditionError(WarmfleetError):
    """The target is not in a state that allows the call (Evict of a session in use)."""


class PayloadTooLargeError(WarmfleetError):
    """A request body over the gateway's limit (--max-body-bytes)."""


class QueueFullError(WarmfleetError):
    """A bound on waiting or open requests is reached (the message names it); retry after
    `retry_after_ms`."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class UnavailableError(ServiceError):
    """A part the call needs is down or unreachable (Redis, every worker, the kvstore);
    retrying later may succeed."""


class DeadlineExceededError(WarmfleetError):
    """The request's deadline passed."""


class JobFailedError(WarmfleetError):
    """A worker ended the request with an error; `code` is its gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class InternalError(WarmfleetError):
    """A fault of warmfleet's own (a command Redis refused that it should not have sent):
    retrying will not help; the message says what failed."""
