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


class ServiceError(WarmfleetError):
    """A service this command needs could not be started or reached (Redis, a worker)."""


class SpillFileError(WarmfleetError):
    """A spill file failed a check (magic, version, model, layout, size or checksum)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.reason = reason
