"""The OpenAI Responses face: POST /v1/responses (what Codex CLI speaks), streamed as
`response.*` events each with its `sequence_number` (created, in_progress, output items
and their parts and deltas, completed or incomplete), or one response object. The output
is a message item for text and a function_call item for each tool call."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from broker.messages import Completion
from common.enums import FinishReason
from common.errors import WarmfleetError
from common.ids import check_session_id
from gateway.http_errors import describe
from gateway.http_jobs import HttpContext, Started, collect, scanned, start
from gateway.http_request import SESSION_HEADER, Body, get, number, session_of
from gateway.responses_input import chat_of, check_format, tools_of
from gateway.sse import EventStream, event
from gateway.tool_calls import Piece, ToolCall, ToolCallScanner
from gateway.validate import GenerateInput


def input_of(body: Body, request: Request) -> GenerateInput:
    check_format(body)
    return GenerateInput(
        session_id=_session(body, request),
        messages=chat_of(body),
        tools=tools_of(body),
        max_tokens=get(body, "max_output_tokens", int),
        max_tokens_default=None,  # as OpenAI: up to the context's end
        temperature=number(body, "temperature"),
        top_p=number(body, "top_p"),
    )


def _session(body: Body, request: Request) -> str:
    """X-Session-Id, else `prompt_cache_key` (Codex sends its session's id there) when it
    can name one: printable ASCII, as the X-Session-Id header that echoes it must be."""
    key = body.get("prompt_cache_key")
    if request.headers.get(SESSION_HEADER) or not isinstance(key, str) or not _header_safe(key):
        return session_of(request)
    return check_session_id(key, "prompt_cache_key")


def _header_safe(text: str) -> bool:
    return bool(text) and text.isascii() and text.isprintable()


def usage(c: Completion) -> dict[str, Any]:
    u = c.usage
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt_tokens + u.completion_tokens}  # fmt: skip


def message_id(request_id: str, at: int) -> str:
    """The id of the message item at output index `at`."""
    return f"msg_{request_id}_{at}"


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [text_part(text)] if status == "completed" else []}  # fmt: skip


def call_item(call: ToolCall, status: str = "completed") -> dict[str, Any]:
    arguments = call.arguments_json if status == "completed" else ""
    return {"id": f"fc_{call.id}", "type": "function_call", "status": status,
            "call_id": f"call_{call.id}", "name": call.name, "arguments": arguments}  # fmt: skip


async def responses(ctx: HttpContext, request: Request) -> Response:
    body = await ctx.body(request)
    ctx.check_model(get(body, "model", str))
    inp = input_of(body, request)
    started = await start(ctx, request, inp)
    head = {"id": f"resp_{started.job.request_id}", "object": "response",
            "created_at": started.created, "model": ctx.model_id, "error": None,
            "incomplete_details": None, "instructions": get(body, "instructions", str),
            "max_output_tokens": get(body, "max_output_tokens", int), "metadata": {},
            "parallel_tool_calls": True, "previous_response_id": None, "store": False,
            "temperature": inp.temperature, "top_p": inp.top_p,
            "tool_choice": "none" if body.get("tool_choice") == "none" else "auto",
            "tools": get(body, "tools", list, []), "text": {"format": {"type": "text"}},
            "truncation": "disabled"}  # fmt: skip
    scanner = ToolCallScanner.offering(inp.tools)
    if get(body, "stream", bool, False):
        events = _Stream(head, started.job.request_id).events(started, scanner)
        return EventStream(events, started.headers)  # type: ignore[return-value]
    chunks, c = await collect(started)
    text, calls = scanner.whole(ch.text for ch in chunks)
    item_id = message_id(started.job.request_id, 0)
    output = [message_item(item_id, text, "completed")] if text else []
    output += [call_item(call) for call in calls]
    return JSONResponse(finished(head, output, c), headers=started.headers)


def finished(head: dict[str, Any], output: list[dict[str, Any]], c: Completion) -> dict[str, Any]:
    """The whole response once the completion came."""
    cut = c.finish_reason == FinishReason.LENGTH
    return {**head, "status": "incomplete" if cut else "completed", "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "completed_at": int(time.time()), "usage": usage(c)}  # fmt: skip


class _Stream:
    """The events of one streamed response, numbered; a text item opens with the first
    text and closes before a call or at the end; each call is an item of its own, its
    arguments sent whole."""

    def __init__(self, head: dict[str, Any], request_id: str) -> None:
        self.head = head
        self.request_id = request_id
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # the items done
        self.text: str | None = None  # the open text item's text so far

    def _event(self, kind: str, **fields: Any) -> bytes:
        self.sequence += 1
        return event({"type": kind, "sequence_number": self.sequence - 1, **fields}, kind)

    async def events(
        self, started: Started, scanner: ToolCallScanner
    ) -> AsyncGenerator[bytes, None]:
        opened = {**self.head, "status": "in_progress", "output": [], "usage": None}
        yield self._event("response.created", response=opened)
        yield self._event("response.in_progress", response=opened)
        try:
            async with aclosing(scanned(started, scanner)) as results:
                async for got in results:
                    if not isinstance(got, Completion):
                        for out in self._pieces(got):
                            yield out
                        continue
                    for out in self._close_text():
                        yield out
                    done = finished(self.head, self.output, got)
                    kind = "response.incomplete" if done["status"] == "incomplete" else (
                        "response.completed")  # fmt: skip
                    yield self._event(kind, response=done)
        except WarmfleetError as e:  # after the 200: the error travels in the stream
            _, _, code, _ = describe(e)
            failed = {**self.head, "status": "failed", "output": self.output,
                      "error": {"code": code, "message": str(e)}}  # fmt: skip
            yield self._event("response.failed", response=failed)

    def _pieces(self, pieces: list[Piece]) -> list[bytes]:
        out: list[bytes] = []
        for p in pieces:
            if isinstance(p, str):
                out += self._text(p)
            else:
                out += self._close_text() + self._call(p)
        return out

    def _text(self, delta: str) -> list[bytes]:
        out = []
        at = len(self.output)
        item_id = message_id(self.request_id, at)
        where = {"item_id": item_id, "output_index": at, "content_index": 0}
        if self.text is None:
            self.text = ""
            out.append(self._event("response.output_item.added", output_index=at,
                                   item=message_item(item_id, "", "in_progress")))  # fmt: skip
            out.append(self._event("response.content_part.added", **where, part=text_part("")))
        self.text += delta
        out.append(self._event("response.output_text.delta", **where, delta=delta, logprobs=[]))
        return out

    def _close_text(self) -> list[bytes]:
        if self.text is None:
            return []
        text, self.text = self.text, None
        at = len(self.output)
        item_id = message_id(self.request_id, at)
        item = message_item(item_id, text, "completed")
        self.output.append(item)
        where = {"item_id": item_id, "output_index": at, "content_index": 0}
        return [self._event("response.output_text.done", **where, text=text, logprobs=[]),
                self._event("response.content_part.done", **where, part=item["content"][0]),
                self._event("response.output_item.done", output_index=at, item=item)]  # fmt: skip

    def _call(self, call: ToolCall) -> list[bytes]:
        at, item = len(self.output), call_item(call)
        self.output.append(item)
        where = {"item_id": item["id"], "output_index": at}
        return [self._event("response.output_item.added", output_index=at,
                            item=call_item(call, "in_progress")),
                self._event("response.function_call_arguments.delta", **where,
                            delta=item["arguments"]),
                self._event("response.function_call_arguments.done", **where,
                            arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=at, item=item)]  # fmt: skip
