"""One Generate call over gRPC as the chaos and soak scripts make it: read to its end (or
cancelled after some chunks), its chunk indexes checked for duplicates and gaps, and its
tokens against the in-process reference of the same request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from common.sampling import SamplingParams
from common.v1 import inference_pb2 as pb
from common.v1 import inference_pb2_grpc
from engine.device import set_threads
from engine.engine import Engine
from engine.model import Model
from engine.sequence import Request
from engine.text.chat import render_chat

OK = "OK"
HUNG = "HUNG"  # past its deadline: the call's DEADLINE_EXCEEDED, or no end at all
CANCELLED_BY_CLIENT = "CANCELLED_BY_CLIENT"
NO_COMPLETION = "NO_COMPLETION"  # the stream ended without a completion message
_GUARD_S = 5.0  # past the deadline, the client gives up on a call that never ends
# a client that retries on UNAVAILABLE should see the gateway back when it is: gRPC's own
# reconnect back-off (1 s, growing to 120 s) would otherwise add up to minutes
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000)]  # fmt: skip


@dataclass(frozen=True)
class Expected:
    """What a request must produce: the reference's token ids and text."""

    token_ids: tuple[int, ...]
    text: str


@dataclass
class Attempt:
    """One call: when it ran, how it ended, and what its stream held."""

    start: float
    end: float = 0.0
    code: str = OK
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    duplicates: int = 0  # tokens at an index already received
    missing: int = 0  # indexes skipped
    wrong: bool = False  # tokens or text other than the reference's (a prefix if it failed)
    reported_tokens: int = -1  # the completion's count of generated tokens
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (when, tokens so far)
    turn: int = 0  # the request it is an attempt of (a retry repeats it)

    @property
    def latency_s(self) -> float:
        return self.end - self.start


def reference_model(path: Path) -> Model:
    """The model for the reference runs, on one thread: two threads on cores that the
    cluster's processes share slow down many times over (engine/device.py)."""
    set_threads(1)
    return Model.load(path, device="cpu")


def prompt_ids(model: Model, messages: Sequence[dict[str, str]]) -> list[int]:
    """The prompt the gateway builds from chat messages."""
    assert model.tokenizer.chat_template is not None
    return model.tokenizer.encode(render_chat(model.tokenizer.chat_template, list(messages)))


def references(
    model: Model, requests: Mapping[str, tuple[Sequence[dict[str, str]], SamplingParams]]
) -> dict[str, Expected]:
    """Each request run in-process, all in one batch: its tokens and text."""
    batch = [Request(rid, prompt_ids(model, m), p) for rid, (m, p) in requests.items()]
    out = Engine(model).generate(batch)
    return {
        rid: Expected(tuple(t for o in steps for t in o.token_ids), "".join(o.text for o in steps))
        for rid, steps in out.items()
    }


def stub_for(channel: grpc.aio.Channel) -> inference_pb2_grpc.InferenceStub:
    return inference_pb2_grpc.InferenceStub(channel)


async def generate(
    stub: inference_pb2_grpc.InferenceStub,
    request: pb.GenerateRequest,
    *,
    deadline_s: float,
    metadata: Sequence[tuple[str, str]] = (),
    cancel_after: int | None = None,
) -> Attempt:
    """Run one Generate call; with `cancel_after`, cancel it once that many chunks came."""
    attempt = Attempt(start=time.monotonic())
    call = stub.Generate(request, timeout=deadline_s, metadata=tuple(metadata) or None)
    try:
        await asyncio.wait_for(_read(call, attempt, cancel_after), deadline_s + _GUARD_S)
    except grpc.aio.AioRpcError as e:
        code = e.code()
        attempt.code = HUNG if code == grpc.StatusCode.DEADLINE_EXCEEDED else code.name
    except TimeoutError:
        call.cancel()
        attempt.code = HUNG
    attempt.end = time.monotonic()
    return attempt


async def _read(call: grpc.aio.UnaryStreamCall, attempt: Attempt, cancel_after: int | None) -> None:
    expected_index, num_chunks = 0, 0
    async for response in call:
        if response.HasField("completion"):
            attempt.reported_tokens = response.completion.usage.completion_tokens
            return
        chunk = response.chunk
        if chunk.token_ids:
            if chunk.index < expected_index:
                attempt.duplicates += min(len(chunk.token_ids), expected_index - chunk.index)
            elif chunk.index > expected_index:
                attempt.missing += chunk.index - expected_index
            expected_index = max(expected_index, chunk.index + len(chunk.token_ids))
            attempt.arrivals.append((time.monotonic(), expected_index))
        attempt.token_ids.extend(chunk.token_ids)
        attempt.text += chunk.text
        num_chunks += 1
        if cancel_after is not None and num_chunks >= cancel_after:
            call.cancel()
            attempt.code = CANCELLED_BY_CLIENT
            return
    attempt.code = NO_COMPLETION


def check(attempt: Attempt, expected: Expected, *, has_ids: bool = True) -> None:
    """Mark `attempt` wrong unless its text (and its token ids where the API sends them)
    are the reference's: all of them, and their count reported, if it completed; a prefix
    if it ended early."""
    ids, text = tuple(attempt.token_ids), attempt.text
    if attempt.code == OK:
        wrong = text != expected.text or attempt.reported_tokens != len(expected.token_ids)
        attempt.wrong = wrong or (has_ids and ids != expected.token_ids)
    else:
        wrong = not expected.text.startswith(text)
        attempt.wrong = wrong or (has_ids and ids != expected.token_ids[: len(ids)])
