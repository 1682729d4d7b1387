"""Hypothesis strategies for hostile requests: gRPC messages with every field at its edges
(NaN and infinite floats, out-of-range integers, unknown enum values, odd unicode, huge
token ids), raw bytes that are no message at all, and HTTP bodies of the wrong shape."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from common.v1 import inference_pb2 as pb
from tests.planted_bodies import DEPTHS, PLANTED, SURROGATES, nested, planted

U32, U64, I32 = 2**32 - 1, 2**64 - 1, 2**31 - 1
ROLES = ("system", "user", "assistant", "tool")

texts = st.text(max_size=40) | st.sampled_from(["", "\x00", "\ud7ff" * 3, "a" * 300, "é\n\t"])
session_ids = texts | st.sampled_from(["fuzz-a", "fuzz-b", "a:b", "../x", "*", " "])
floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
small_tokens = st.integers(0, 6)  # most valid requests stay short: the suite's time


def _optional(request: pb.GenerateRequest, name: str, value: Any) -> None:
    if value is not None:
        setattr(request, name, value)


def _base_request(draw: st.DrawFn) -> pb.GenerateRequest:
    """A request the gateway should accept, in one of the three input forms."""
    r = pb.GenerateRequest(session_id=draw(st.sampled_from(["fuzz-a", "fuzz-b", ""])))
    kind = draw(st.sampled_from(["messages", "prompt", "token_ids"]))
    if kind == "messages":
        r.messages.messages.add(role="user", content=draw(st.text(max_size=20)))
    elif kind == "prompt":
        r.prompt = draw(st.text(min_size=1, max_size=20))
    else:
        r.token_ids.ids.extend(draw(st.lists(st.integers(0, 300), min_size=1, max_size=20)))
    r.max_tokens = draw(small_tokens)
    return r


HOSTILE_FIELDS = ("session_id", "input", "temperature", "top_p", "min_p", "top_k",
                  "min_tokens", "seed", "max_tokens", "ignore_eos", "stop", "priority")  # fmt: skip


def _hostile(draw: st.DrawFn, r: pb.GenerateRequest, field: str) -> None:
    """Set one field of `r` to a value at or past its edges."""
    if field == "session_id":
        r.session_id = draw(session_ids)
    elif field == "input":
        kind = draw(st.sampled_from(["messages", "prompt", "token_ids", "none"]))
        if kind == "none":
            r.ClearField("input")
        elif kind == "messages":
            del r.messages.messages[:]
            for _ in range(draw(st.integers(0, 4))):
                role = draw(st.sampled_from(ROLES) | texts)
                r.messages.messages.add(role=role, content=draw(texts))
        elif kind == "prompt":
            r.prompt = draw(texts)
        else:
            r.token_ids.ids[:] = draw(st.lists(st.integers(0, U32) | st.integers(0, 300),
                                               max_size=40))  # fmt: skip
    elif field in ("temperature", "top_p", "min_p"):
        setattr(r, field, draw(floats32))
    elif field in ("top_k", "min_tokens"):
        setattr(r, field, draw(st.integers(0, U32) | small_tokens))
    elif field == "seed":
        r.seed = draw(st.integers(0, U64))
    elif field == "max_tokens":
        r.max_tokens = draw(st.integers(-I32 - 1, I32) | small_tokens)
    elif field == "ignore_eos":
        r.ignore_eos = draw(st.booleans())
    elif field == "stop":
        r.stop.extend(draw(st.lists(texts, max_size=20)))
    else:
        setattr(r, field, draw(st.integers(0, 3) | st.integers(-I32 - 1, I32)))


@st.composite
def generate_requests(draw: st.DrawFn) -> pb.GenerateRequest:
    """A valid request with none to all of its fields made hostile."""
    r = _base_request(draw)
    for field in draw(st.lists(st.sampled_from(HOSTILE_FIELDS), max_size=4, unique=True)):
        _hostile(draw, r, field)
    return r


page_requests = st.builds(
    pb.ListSessionsRequest,
    page_size=st.integers(0, U32),
    page_token=texts | st.integers(-(2**70), 2**70).map(str) | st.just("9223372036854775807"),
)
raw_bytes = st.binary(max_size=200) | st.sampled_from([b"\xff" * 10, b"\x0a\xff\xff\xff\xff\x0f"])

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | texts
    | st.sampled_from(SURROGATES),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)


# tool calling's parts: the tools offered, calls and results in the history, in both APIs
FUNCTION = st.fixed_dictionaries(
    {"name": texts | JSON_VALUES}, optional={"parameters": JSON_VALUES, "arguments": JSON_VALUES}
)
TOOLS = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "custom"]) | texts},
    optional={"function": FUNCTION | JSON_VALUES, "name": texts, "input_schema": JSON_VALUES},
)
TOOL_PARTS = {
    "tool_calls": st.lists(st.fixed_dictionaries({"id": texts, "function": FUNCTION}), max_size=2)
    | JSON_VALUES,
    "tool_call_id": texts | JSON_VALUES,
}
BLOCKS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "tool_use", "tool_result", "image"]) | texts},
        optional={"text": texts | JSON_VALUES, "name": texts, "input": JSON_VALUES,
                  "content": JSON_VALUES, "tool_use_id": texts, "is_error": JSON_VALUES},
    ),
    max_size=3,
)  # fmt: skip


# a Responses request's input items
ITEMS = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning"])
     | texts},
    optional={"role": texts, "content": JSON_VALUES | BLOCKS, "call_id": texts,
              "name": texts, "arguments": texts | JSON_VALUES, "output": JSON_VALUES},
)  # fmt: skip


@st.composite
def http_bodies(draw: st.DrawFn) -> bytes:
    """A body for the OpenAI or Anthropic endpoints: a valid one with none to all of its
    fields given odd values, sometimes any JSON, sometimes no JSON at all."""
    kind = draw(st.sampled_from(["fields", "fields", "json", "bytes", "planted"]))
    if kind == "bytes":
        return draw(raw_bytes)
    if kind == "planted":  # a field nested too deep, or holding a lone surrogate
        raw = st.sampled_from(DEPTHS).map(nested) | st.sampled_from(SURROGATES).map(json.dumps)
        return planted(draw(st.sampled_from(PLANTED))[1], draw(raw), '"x"')
    if kind == "json":
        return json.dumps(draw(JSON_VALUES)).encode()
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": draw(st.text(max_size=20))}],
        "prompt": draw(st.text(min_size=1, max_size=20)),
        "input": draw(st.text(min_size=1, max_size=20)),
        "max_tokens": draw(small_tokens),
        "max_output_tokens": draw(small_tokens),
    }
    odd = {
        "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(ROLES) | texts,
                                                    "content": JSON_VALUES | BLOCKS},
                                                   optional=TOOL_PARTS), max_size=3)
        | JSON_VALUES,
        "tools": st.lists(TOOLS | JSON_VALUES, max_size=3) | JSON_VALUES,
        "tool_choice": st.sampled_from(["auto", "none", "required"]) | JSON_VALUES,
        "input": st.lists(ITEMS | JSON_VALUES, max_size=3) | JSON_VALUES,
        "prompt_cache_key": texts | JSON_VALUES,
        "previous_response_id": texts | JSON_VALUES,
        "text": JSON_VALUES,
        "prompt": texts | JSON_VALUES,
        "max_tokens": st.integers(-(2**70), 2**70) | JSON_VALUES,
        "temperature": st.floats(allow_nan=True) | JSON_VALUES,
        "stream": st.booleans() | JSON_VALUES,
        "stop": st.lists(texts, max_size=5) | JSON_VALUES,
        "system": texts | JSON_VALUES,
        "model": texts,
        "chat_template_kwargs": JSON_VALUES,
        "reasoning_effort": texts | JSON_VALUES,
        "thinking": JSON_VALUES,
        "reasoning": JSON_VALUES,
    }  # fmt: skip
    for name in draw(st.lists(st.sampled_from(sorted(odd)), max_size=3, unique=True)):
        body[name] = draw(odd[name])
    return json.dumps(body, allow_nan=True).encode()
