"""The Anthropic face: POST /v1/messages (streamed as message_start, content_block_start,
content_block_delta..., content_block_stop, message_delta, message_stop; or one JSON
object) and POST /v1/messages/count_tokens. The reply's reasoning is a thinking block;
its signature is empty (nothing here checks it when it comes back)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from broker.messages import Completion
from common.enums import FinishReason
from common.errors import InvalidRequestError, WarmfleetError
from gateway.anthropic_messages import chat_of, template_kwargs_of, tools_of
from gateway.http_errors import Shape, error_body
from gateway.http_jobs import (
    HttpContext,
    Part,
    Reader,
    Started,
    collect,
    read_whole,
    scanned,
    start,
)
from gateway.http_request import Body, get, number, session_of, string_list, tenant_of
from gateway.reasoning import Thought
from gateway.sampling_defaults import Defaults
from gateway.sse import EventStream, event
from gateway.tool_calls import ToolCall
from gateway.validate import GenerateInput

SIGNATURE = ""  # a thinking block's: Anthropic's proves its own thoughts; there are none here


def input_of(body: Body, session_id: str) -> GenerateInput:
    max_tokens = get(body, "max_tokens", int)
    if max_tokens is None:
        raise InvalidRequestError("max_tokens", "is required")
    return GenerateInput(
        session_id=session_id,
        messages=chat_of(body),
        tools=tools_of(body),
        max_tokens=max_tokens,
        temperature=number(body, "temperature"),
        top_p=number(body, "top_p"),
        top_k=get(body, "top_k", int),
        stop=string_list(body, "stop_sequences"),
        template_kwargs=template_kwargs_of(body),
        defaults=Defaults.API,  # temperature 1, or the model family's recommendation
    )


def stop_reason(c: Completion, reader: Reader) -> str:
    if c.finish_reason == FinishReason.LENGTH:
        return "max_tokens"
    if c.stop_sequence:
        return "stop_sequence"
    return "tool_use" if reader.num_calls else "end_turn"


def thinking(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": SIGNATURE}


def _user_id(body: Body) -> Any:
    """metadata.user_id: Claude Code sends one per conversation (its user, account and
    session), which names the session where no X-Session-Id does."""
    metadata = body.get("metadata")
    return metadata.get("user_id") if isinstance(metadata, dict) else None


def tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{call.id}", "name": call.name, "input": {}}


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
    inp = input_of(body, session_of(request, _user_id(body), "metadata.user_id"))
    started = await start(ctx, request, inp)
    message: dict[str, Any] = {"id": f"msg_{started.job.request_id}", "type": "message",
                               "role": "assistant", "model": ctx.model_id}  # fmt: skip
    reader = started.reader(inp.tools)
    if get(body, "stream", bool, False):
        events = _events(started, message, reader)
        return EventStream(events, started.headers)  # type: ignore[return-value]
    chunks, c = await collect(started)
    thought, text, calls = read_whole(reader, chunks)
    content = [thinking(thought)] if thought else []
    content += [{"type": "text", "text": text}] if text or not (calls or thought) else []
    content += [{**tool_use(call), "input": call.arguments} for call in calls]
    return JSONResponse(
        {**message, "content": content, "stop_reason": stop_reason(c, reader),
         "stop_sequence": c.stop_sequence or None, "usage": usage(c)},
        headers=started.headers,
    )  # fmt: skip


class _Blocks:
    """The stream's content blocks: reasoning opens a thinking block and text a text block
    (when that one is not open: another closes first), each call is a tool_use block of its
    own, its input sent whole as one input_json_delta. A thinking block's signature comes
    last, as one signature_delta."""

    def __init__(self) -> None:
        self.index = 0  # the block open or next
        self.open: str | None = None  # "text" or "thinking"

    def events(self, pieces: list[Part]) -> list[bytes]:
        out = []
        for p in pieces:
            if isinstance(p, str):
                out += self._open("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": p}))
            elif isinstance(p, Thought):
                out += self._open("thinking", thinking(""))
                out.append(self._delta({"type": "thinking_delta", "thinking": p.text}))
            else:
                out += self.close()
                out.append(self._start(tool_use(p)))
                json_delta = {"type": "input_json_delta", "partial_json": p.arguments_json}
                out += [self._delta(json_delta), self._stop()]
        return out

    def _open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        if self.open == kind:
            return []
        out = self.close()
        self.open = kind
        return [*out, self._start(block)]

    def close(self) -> list[bytes]:
        kind, self.open = self.open, None
        if kind == "thinking":
            return [self._delta({"type": "signature_delta", "signature": SIGNATURE}), self._stop()]
        return [] if kind is None else [self._stop()]

    def end(self) -> list[bytes]:
        """Close the last block; a reply of nothing has one empty text block."""
        if self.index == 0 and self.open is None:
            return [self._start({"type": "text", "text": ""}), self._stop()]
        return self.close()

    def _start(self, block: dict[str, Any]) -> bytes:
        body = {"type": "content_block_start", "index": self.index, "content_block": block}
        return event(body, "content_block_start")

    def _delta(self, delta: dict[str, Any]) -> bytes:
        body = {"type": "content_block_delta", "index": self.index, "delta": delta}
        return event(body, "content_block_delta")

    def _stop(self) -> bytes:
        self.index += 1
        return event({"type": "content_block_stop", "index": self.index - 1}, "content_block_stop")


async def _events(
    started: Started, message: dict[str, Any], reader: Reader
) -> AsyncGenerator[bytes, None]:
    prompt_tokens = len(started.job.prompt_ids)
    start_usage = {"input_tokens": prompt_tokens, "output_tokens": 0}
    opened = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
              "usage": start_usage}  # fmt: skip
    yield event({"type": "message_start", "message": opened}, "message_start")
    blocks = _Blocks()
    try:
        async with aclosing(scanned(started, reader)) as results:
            async for got in results:
                if not isinstance(got, Completion):
                    for out in blocks.events(got):
                        yield out
                    continue
                for out in blocks.end():
                    yield out
                end = {"stop_reason": stop_reason(got, reader),
                       "stop_sequence": got.stop_sequence or None}  # fmt: skip
                yield event({"type": "message_delta", "delta": end, "usage": usage(got)},
                            "message_delta")  # fmt: skip
                yield event({"type": "message_stop"}, "message_stop")
    except WarmfleetError as e:  # after the 200: the error travels in the stream
        yield event(error_body(e, Shape.ANTHROPIC), "error")


async def count_tokens(ctx: HttpContext, request: Request) -> Response:
    body = await ctx.body(request)
    ctx.check_model(get(body, "model", str))
    tenant_of(request, ctx.keys)
    inp = GenerateInput(
        messages=chat_of(body), tools=tools_of(body), template_kwargs=template_kwargs_of(body)
    )
    return JSONResponse({"input_tokens": await ctx.jobs.count_tokens(inp)})
