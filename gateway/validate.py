"""Turn a GenerateRequest into a tokenized WireRequest, or a precise error naming the field."""

from __future__ import annotations

import secrets
import time
import unicodedata
import uuid
from dataclasses import asdict

from broker.keys import PRIORITIES
from broker.wire import WireRequest
from engine.chat import render_chat, validate_messages
from engine.config import ModelConfig
from engine.sampling import SamplingParams
from engine.tokenizer import Tokenizer
from warmfleet.errors import InvalidRequestError, PromptTooLongError
from warmfleet.v1 import inference_pb2 as pb

MAX_SESSION_ID_BYTES = 128
DEFAULT_MAX_TOKENS = 256
PRIORITY_NAMES = {
    pb.PRIORITY_UNSPECIFIED: "normal",
    pb.PRIORITY_INTERACTIVE: "interactive",
    pb.PRIORITY_NORMAL: "normal",
    pb.PRIORITY_BATCH: "batch",
}


def check_session_id(session_id: str, field: str = "session_id") -> str:
    """Session ids are up to 128 UTF-8 bytes of printable characters ("" means none)."""
    if len(session_id.encode("utf-8")) > MAX_SESSION_ID_BYTES:
        raise InvalidRequestError(field, f"longer than {MAX_SESSION_ID_BYTES} bytes")
    bad = next((c for c in session_id if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")), None)
    if bad is not None:
        raise InvalidRequestError(field, f"contains control character U+{ord(bad):04X}")
    return session_id


def require_session_id(session_id: str, field: str = "session_id") -> str:
    """A session id that must be given."""
    if not session_id:
        raise InvalidRequestError(field, "is required")
    return check_session_id(session_id, field)


def prompt_ids(request: pb.GenerateRequest, tokenizer: Tokenizer) -> list[int]:
    kind = request.WhichOneof("input")
    if kind == "messages":
        messages = [{"role": m.role, "content": m.content} for m in request.messages.messages]
        validate_messages(messages)
        if tokenizer.chat_template is None:
            raise InvalidRequestError("messages", "the model has no chat template; send prompt")
        return tokenizer.encode(render_chat(tokenizer.chat_template, messages))
    if kind == "prompt":
        if not request.prompt:
            raise InvalidRequestError("prompt", "is empty")
        return tokenizer.encode(request.prompt)
    if kind == "token_ids":
        ids = list(request.token_ids.ids)
        if not ids:
            raise InvalidRequestError("token_ids", "is empty")
        bad = next((t for t in ids if t >= tokenizer.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                "token_ids", f"id {bad} is outside the vocabulary [0, {tokenizer.vocab_size})"
            )
        return ids
    raise InvalidRequestError("input", "one of messages, prompt or token_ids is required")


def sampling_of(request: pb.GenerateRequest) -> SamplingParams:
    def opt(name: str, default: float | int | None) -> float | int | None:
        return getattr(request, name) if request.HasField(name) else default

    return SamplingParams(
        temperature=float(opt("temperature", 0.0) or 0.0),
        top_k=int(opt("top_k", 0) or 0),
        top_p=float(opt("top_p", 1.0)),  # type: ignore[arg-type]
        min_p=float(opt("min_p", 0.0) or 0.0),
        # fixed here when absent, so that a retry on another worker draws the same tokens
        seed=int(request.seed) if request.HasField("seed") else secrets.randbits(63),
        max_tokens=int(opt("max_tokens", DEFAULT_MAX_TOKENS)),  # type: ignore[arg-type]
        stop=tuple(request.stop),
    )


def build_request(
    request: pb.GenerateRequest,
    session_id: str,
    tenant: str,
    tokenizer: Tokenizer,
    config: ModelConfig,
    timeout_s: float,
) -> WireRequest:
    """Everything checked that can be checked here; raises InvalidRequestError subclasses."""
    check_session_id(session_id)
    if request.priority not in PRIORITY_NAMES:
        raise InvalidRequestError("priority", f"unknown value {request.priority}")
    sampling = sampling_of(request)
    ids = prompt_ids(request, tokenizer)
    if len(ids) + 1 > config.context_length:
        raise PromptTooLongError(len(ids), config.context_length)
    now = time.time()
    return WireRequest(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        session_id=session_id,
        prompt_ids=ids,
        sampling={**asdict(sampling), "stop": list(sampling.stop)},
        priority=PRIORITY_NAMES[request.priority],
        accepted_at=now,
        deadline_at=now + timeout_s,
    )


assert set(PRIORITY_NAMES.values()) == set(PRIORITIES)
