"""The Anthropic face: POST /v1/messages (streamed as message_start, content_block_start,
content_block_delta..., content_block_stop, message_delta, message_stop; or one JSON
object) and POST /v1/messages/count_tokens."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from broker.messages import Completion, TokenChunk
from common.enums import FinishReason
from common.errors import InvalidRequestError, WarmfleetError
from gateway.http_errors import Shape, error_body
from gateway.http_jobs import HttpContext, Started, collect, start
from gateway.http_request import Body, get, number, session_of, string_list, tenant_of
from gateway.sse import EventStream, event
from gateway.validate import GenerateInput


def text_of(content: Any, where: str) -> str:
    """A string, or a list of text blocks (other block types are not supported)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        for b in content
    ):
        return "".join(b["text"] for b in content)
    raise InvalidRequestError(where, "must be a string or a list of text blocks")


def chat_of(body: Body) -> list[dict[str, str]]:
    """`system` and `messages` as one chat."""
    raw = get(body, "messages", list)
    if not raw:
        raise InvalidRequestError("messages", "is required (a non-empty list)")
    chat = []
    system = body.get("system")
    if system is not None:
        chat.append({"role": "system", "content": text_of(system, "system")})
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise InvalidRequestError("messages", f"[{i}]: role must be user or assistant")
        chat.append({"role": m["role"], "content": text_of(m.get("content"), f"messages[{i}]")})
    return chat


def input_of(body: Body, session_id: str) -> GenerateInput:
    max_tokens = get(body, "max_tokens", int)
    if max_tokens is None:
        raise InvalidRequestError("max_tokens", "is required")
    return GenerateInput(
        session_id=session_id,
        messages=chat_of(body),
        max_tokens=max_tokens,
        temperature=number(body, "temperature"),
        top_p=number(body, "top_p"),
        top_k=get(body, "top_k", int),
        stop=string_list(body, "stop_sequences"),
    )


def stop_reason(c: Completion) -> str:
    if c.finish_reason == FinishReason.LENGTH:
        return "max_tokens"
    return "stop_sequence" if c.stop_sequence else "end_turn"


def usage(c: Completion) -> dict[str, int]:
    u = c.usage
    return {
        "input_tokens": u.prompt_tokens,
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


async def messages(ctx: HttpContext, request: Request) -> Response:
    body = await ctx.body(request)
    ctx.check_model(get(body, "model", str))
    started = await start(ctx, request, input_of(body, session_of(request)))
    message: dict[str, Any] = {"id": f"msg_{started.job.request_id}", "type": "message",
                               "role": "assistant", "model": ctx.model_id}  # fmt: skip
    if get(body, "stream", bool, False):
        return EventStream(_events(started, message), started.headers)  # type: ignore[return-value]
    chunks, c = await collect(started)
    return JSONResponse(
        {**message, "content": [{"type": "text", "text": "".join(ch.text for ch in chunks)}],
         "stop_reason": stop_reason(c), "stop_sequence": c.stop_sequence or None,
         "usage": usage(c)},
        headers=started.headers,
    )  # fmt: skip


async def _events(started: Started, message: dict[str, Any]) -> AsyncGenerator[bytes, None]:
    prompt_tokens = len(started.job.prompt_ids)
    start_usage = {"input_tokens": prompt_tokens, "output_tokens": 0}
    opened = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
              "usage": start_usage}  # fmt: skip
    yield event({"type": "message_start", "message": opened}, "message_start")
    block = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    yield event(block, "content_block_start")
    try:
        async with aclosing(started.results) as results:
            async for m in results:
                if isinstance(m, TokenChunk):
                    if m.text:
                        delta = {"type": "text_delta", "text": m.text}
                        yield event({"type": "content_block_delta", "index": 0, "delta": delta},
                                    "content_block_delta")  # fmt: skip
                    continue
                yield event({"type": "content_block_stop", "index": 0}, "content_block_stop")
                end = {"stop_reason": stop_reason(m), "stop_sequence": m.stop_sequence or None}
                yield event({"type": "message_delta", "delta": end, "usage": usage(m)},
                            "message_delta")  # fmt: skip
                yield event({"type": "message_stop"}, "message_stop")
    except WarmfleetError as e:  # after the 200: the error travels in the stream
        yield event(error_body(e, Shape.ANTHROPIC), "error")


async def count_tokens(ctx: HttpContext, request: Request) -> Response:
    body = await ctx.body(request)
    ctx.check_model(get(body, "model", str))
    tenant_of(request, ctx.keys)
    inp = GenerateInput(messages=chat_of(body))
    return JSONResponse({"input_tokens": await ctx.jobs.count_tokens(inp)})
