"""What travels through Redis: a request body, and the events on a request's out stream."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

Fields = dict[str, str]


@dataclass(slots=True)
class WireRequest:
    """A validated, tokenized request as the gateway enqueues it."""

    request_id: str
    tenant: str
    session_id: str  # "" when the client named no session
    prompt_ids: list[int]
    sampling: dict[str, Any]  # the keyword arguments of engine.sampling.SamplingParams
    priority: str
    accepted_at: float  # unix seconds, when the gateway accepted it
    deadline_at: float  # unix seconds; past it the request is dropped
    kv_hint: str = ""  # where the gateway expects the KV: "warm" when pinned

    def encode(self) -> Fields:
        return {"body": json.dumps(asdict(self), separators=(",", ":"))}

    @classmethod
    def decode(cls, fields: Fields) -> WireRequest:
        return cls(**json.loads(fields["body"]))


@dataclass(slots=True)
class Control:
    """An order for one worker, sent on its pinned stream (e.g. drop a session's KV)."""

    op: str
    args: dict[str, str] = field(default_factory=dict)

    def encode(self) -> Fields:
        return {"op": self.op, **self.args}

    @classmethod
    def decode(cls, fields: Fields) -> Control:
        args = {k: v for k, v in fields.items() if k != "op"}
        return cls(fields["op"], args)


# Out stream events: a chunk of tokens, the completion, or an error; "k" tells which.
def chunk_event(index: int, token_ids: list[int], text: str) -> Fields:
    return {"k": "chunk", "i": str(index), "t": ",".join(map(str, token_ids)), "x": text}


def done_event(completion: dict[str, Any]) -> Fields:
    return {"k": "done", "c": json.dumps(completion, separators=(",", ":"))}


def error_event(code: str, message: str) -> Fields:
    """`code` is a gRPC status name, e.g. INVALID_ARGUMENT."""
    return {"k": "error", "code": code, "m": message}


def parse_tokens(raw: str) -> list[int]:
    return [int(t) for t in raw.split(",")] if raw else []
