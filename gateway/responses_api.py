"""The OpenAI Responses face: POST /v1/responses (what Codex CLI speaks), streamed as
`response.*` events each with its `sequence_number` (created, in_progress, output items
and their parts and deltas, completed or incomplete), or one response object. The output
is a reasoning item for the reply's reasoning, a message item for text and a function_call
item for each tool call."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from broker.messages import Completion
from common.enums import FinishReason
from common.errors import WarmfleetError
from gateway.http_errors import describe
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
from gateway.http_request import Body, get, number, session_of
from gateway.responses_input import chat_of, check_format, template_kwargs_of, tools_of
from gateway.sampling_defaults import Defaults
from gateway.sse import EventStream, event
from gateway.tool_calls import ToolCall
from gateway.validate import GenerateInput


def input_of(body: Body, request: Request) -> GenerateInput:
    check_format(body)
    return GenerateInput(
        session_id=session_of(request, body.get("prompt_cache_key"), "prompt_cache_key"),
        messages=chat_of(body),
        tools=tools_of(body),
        max_tokens=get(body, "max_output_tokens", int),
        max_tokens_default=None,  # as OpenAI: up to the context's end
        temperature=number(body, "temperature"),
        top_p=number(body, "top_p"),
        template_kwargs=template_kwargs_of(body),
        defaults=Defaults.API,  # temperature 1, or the model family's recommendation
    )


def usage(c: Completion, reasoning_tokens: int) -> dict[str, Any]:
    u = c.usage
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": u.prompt_tokens + u.completion_tokens}  # fmt: skip


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [text_part(text)] if status == "completed" else []}  # fmt: skip


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "reasoning",
        "status": status,
        "summary": [],
        "content": [reasoning_part(text)] if status == "completed" else [],
        "encrypted_content": None,
    }


@dataclass(frozen=True, slots=True)
class ItemKind:
    """An output item whose text streams: a message's or the reasoning's."""

    prefix: str  # of its id
    item: Callable[[str, str, str], dict[str, Any]]  # (id, text, status) -> the item
    part: Callable[[str], dict[str, Any]]
    events: str  # its deltas' event names: "{events}.delta", "{events}.done"
    extra: dict[str, Any]  # more fields of those events


MESSAGE = ItemKind("msg", message_item, text_part, "response.output_text", {"logprobs": []})
REASONING = ItemKind("rs", reasoning_item, reasoning_part, "response.reasoning_text", {})


def item_id(kind: ItemKind, request_id: str, at: int) -> str:
    """The id of the item at output index `at`."""
    return f"{kind.prefix}_{request_id}_{at}"


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
    reader = started.reader(inp.tools)
    if get(body, "stream", bool, False):
        events = _Stream(head, started.job.request_id).events(started, reader)
        return EventStream(events, started.headers)  # type: ignore[return-value]
    chunks, c = await collect(started)
    thought, text, calls = read_whole(reader, chunks)
    output: list[dict[str, Any]] = []
    for kind, content in ((REASONING, thought), (MESSAGE, text)):
        if content:
            at = item_id(kind, started.job.request_id, len(output))
            output.append(kind.item(at, content, "completed"))
    output += [call_item(call) for call in calls]
    done = finished(head, output, c, reader.reasoning_tokens)
    return JSONResponse(done, headers=started.headers)


def finished(
    head: dict[str, Any], output: list[dict[str, Any]], c: Completion, reasoning_tokens: int
) -> dict[str, Any]:
    """The whole response once the completion came."""
    cut = c.finish_reason == FinishReason.LENGTH
    return {
        **head,
        "status": "incomplete" if cut else "completed",
        "output": output,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "completed_at": int(time.time()),
        "usage": usage(c, reasoning_tokens),
    }


class _Stream:
    """The events of one streamed response, numbered. Reasoning and text each open an item
    with their first piece and close it before anything else comes, or at the end; each
    call is an item of its own, its arguments sent whole."""

    def __init__(self, head: dict[str, Any], request_id: str) -> None:
        self.head = head
        self.request_id = request_id
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # the items done
        self.open: ItemKind | None = None  # the item streaming now
        self.text = ""  # its text so far

    def _event(self, kind: str, **fields: Any) -> bytes:
        self.sequence += 1
        return event({"type": kind, "sequence_number": self.sequence - 1, **fields}, kind)

    async def events(self, started: Started, reader: Reader) -> AsyncGenerator[bytes, None]:
        opened = {**self.head, "status": "in_progress", "output": [], "usage": None}
        yield self._event("response.created", response=opened)
        yield self._event("response.in_progress", response=opened)
        try:
            async with aclosing(scanned(started, reader)) as results:
                async for got in results:
                    if not isinstance(got, Completion):
                        for out in self._pieces(got):
                            yield out
                        continue
                    for out in self._close():
                        yield out
                    done = finished(self.head, self.output, got, reader.reasoning_tokens)
                    kind = "response.incomplete" if done["status"] == "incomplete" else (
                        "response.completed")  # fmt: skip
                    yield self._event(kind, response=done)
        except WarmfleetError as e:  # after the 200: the error travels in the stream
            _, _, code, _ = describe(e)
            failed = {**self.head, "status": "failed", "output": self.output,
                      "error": {"code": code, "message": str(e)}}  # fmt: skip
            yield self._event("response.failed", response=failed)

    def _pieces(self, pieces: list[Part]) -> list[bytes]:
        out: list[bytes] = []
        for p in pieces:
            if isinstance(p, ToolCall):
                out += self._close() + self._call(p)
            elif isinstance(p, str):
                out += self._delta(MESSAGE, p)
            else:
                out += self._delta(REASONING, p.text)
        return out

    def _where(self) -> dict[str, Any]:
        assert self.open is not None
        at = len(self.output)
        return {
            "item_id": item_id(self.open, self.request_id, at),
            "output_index": at,
            "content_index": 0,
        }

    def _delta(self, kind: ItemKind, delta: str) -> list[bytes]:
        out = [] if self.open in (kind, None) else self._close()
        if self.open is None:
            self.open, self.text = kind, ""
            where = self._where()
            added = kind.item(where["item_id"], "", "in_progress")
            at = where["output_index"]
            out.append(self._event("response.output_item.added", output_index=at, item=added))
            out.append(self._event("response.content_part.added", **where, part=kind.part("")))
        self.text += delta
        out.append(self._event(f"{kind.events}.delta", **self._where(), delta=delta, **kind.extra))
        return out

    def _close(self) -> list[bytes]:
        kind = self.open
        if kind is None:
            return []
        where = self._where()
        item = kind.item(where["item_id"], self.text, "completed")
        self.output.append(item)
        self.open = None
        return [
            self._event(f"{kind.events}.done", **where, text=self.text, **kind.extra),
            self._event("response.content_part.done", **where, part=item["content"][0]),
            self._event("response.output_item.done", output_index=where["output_index"], item=item),
        ]

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
