"""Turn a GenerateRequest into the Job a worker runs, or a precise error naming the field.
Everything a request can get wrong is found here, once."""

from __future__ import annotations

import secrets
import time
import uuid

from broker.messages import Job
from common.enums import Priority
from common.errors import InvalidRequestError
from common.ids import check_session_id
from common.pb_maps import PRIORITY_FROM_PB
from common.sampling import SamplingParams
from common.v1 import inference_pb2 as pb
from engine.chat import render_chat, validate_messages
from engine.config import ModelConfig
from engine.tokenizer import Tokenizer

DEFAULT_MAX_TOKENS = 256


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
        if not request.token_ids.ids:
            raise InvalidRequestError("token_ids", "is empty")
        return list(request.token_ids.ids)
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


def priority_of(request: pb.GenerateRequest) -> Priority:
    if request.priority not in PRIORITY_FROM_PB:
        raise InvalidRequestError("priority", f"unknown value {request.priority}")
    return PRIORITY_FROM_PB[request.priority]


def build_job(
    request: pb.GenerateRequest,
    session_id: str,
    tenant: str,
    tokenizer: Tokenizer,
    config: ModelConfig,
    timeout_s: float,
) -> Job:
    """Everything checked that can be checked here; raises InvalidRequestError subclasses."""
    check_session_id(session_id)
    priority = priority_of(request)
    sampling = sampling_of(request)
    ids = prompt_ids(request, tokenizer)
    config.check_prompt(ids)
    now = time.time()
    return Job(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        session_id=session_id,
        prompt_ids=tuple(ids),
        sampling=sampling,
        priority=priority,
        accepted_at=now,
        deadline_at=now + timeout_s,
    )
