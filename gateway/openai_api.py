"""The OpenAI face: POST /v1/chat/completions, POST /v1/completions, GET /v1/models; streamed
as SSE `data:` chunks ending with `data: [DONE]`, or one JSON object. Unknown fields are
ignored as OpenAI does; wrong types are 400 naming the field."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from broker.messages import Completion, TokenChunk
from common.enums import FinishReason, Priority
from common.errors import InvalidRequestError, WarmfleetError
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
from gateway.http_request import Body, get, number, session_of, string_list
from gateway.openai_messages import chat_messages, template_kwargs_of, tools_of
from gateway.reasoning import Thought
from gateway.sampling_defaults import Defaults
from gateway.sse import DONE, EventStream, event
from gateway.tool_calls import ToolCall
from gateway.validate import GenerateInput

FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length",
          FinishReason.CANCELLED: "stop"}  # fmt: skip


def sampling_fields(body: Body, session_id: str) -> dict[str, Any]:
    """The fields both endpoints share, as GenerateInput arguments."""
    if get(body, "n", int, 1) != 1:
        raise InvalidRequestError("n", "only n=1 is supported")
    max_tokens = get(body, "max_completion_tokens", int) or get(body, "max_tokens", int)
    priority = get(body, "priority", str, "normal")
    if priority not in Priority.__members__.values():
        raise InvalidRequestError("priority", "one of interactive, normal, batch")
    return {
        "session_id": session_id,
        "temperature": number(body, "temperature"),
        "top_p": number(body, "top_p"),
        "top_k": get(body, "top_k", int),
        "min_p": number(body, "min_p"),
        "seed": get(body, "seed", int),
        "max_tokens": max_tokens,
        "max_tokens_default": None,  # as OpenAI: without max_tokens, up to the context's end
        "stop": string_list(body, "stop"),
        "priority": Priority(priority),
        "ignore_eos": get(body, "ignore_eos", bool, False),
        "min_tokens": get(body, "min_tokens", int, 0),
        "defaults": Defaults.API,  # temperature 1, or the model family's recommendation
    }


def usage(c: Completion, reasoning_tokens: int = 0) -> dict[str, Any]:
    u = c.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }


async def chat_completions(ctx: HttpContext, request: Request) -> Response:
    body = await ctx.body(request)
    ctx.check_model(get(body, "model", str))
    stream = get(body, "stream", bool, False)
    options = get(body, "stream_options", dict, {})
    inp = GenerateInput(
        messages=chat_messages(body),
        tools=tools_of(body),
        template_kwargs=template_kwargs_of(body),
        **sampling_fields(body, session_of(request)),
    )
    started = await start(ctx, request, inp)
    base = {"id": f"chatcmpl-{started.job.request_id}", "created": started.created,
            "model": ctx.model_id}  # fmt: skip
    reader = started.reader(inp.tools)
    if stream:
        chunks = _chat_chunks(started, base, reader, bool(options.get("include_usage")))
        return EventStream(chunks, started.headers)  # type: ignore[return-value]
    chunks_got, c = await collect(started)
    thought, text, calls = read_whole(reader, chunks_got)
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if thought:
        message["reasoning_content"] = thought
    if calls:
        message["tool_calls"] = [_call(call) for call in calls]
    choice = {"index": 0, "message": message, "finish_reason": _finish(c, reader),
              "logprobs": None}  # fmt: skip
    return JSONResponse(
        {
            **base,
            "object": "chat.completion",
            "choices": [choice],
            "usage": usage(c, reader.reasoning_tokens),
        },
        headers=started.headers,
    )


def _call(call: ToolCall) -> dict[str, Any]:
    return {"id": f"call_{call.id}", "type": "function",
            "function": {"name": call.name, "arguments": call.arguments_json}}  # fmt: skip


def _finish(c: Completion, reader: Reader) -> str:
    if reader.num_calls and c.finish_reason == FinishReason.STOP:
        return "tool_calls"
    return FINISH[c.finish_reason]


def _delta(p: Part) -> dict[str, Any]:
    """A streamed piece as a chunk's delta: reasoning_content as vLLM and llama-server send."""
    if isinstance(p, str):
        return {"content": p}
    if isinstance(p, Thought):
        return {"reasoning_content": p.text}
    return {"tool_calls": [{"index": p.index, **_call(p)}]}


async def _chat_chunks(
    started: Started, base: dict[str, Any], reader: Reader, include_usage: bool
) -> AsyncGenerator[bytes, None]:
    head = {**base, "object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return event({**head, "choices": [choice]})

    yield chunk({"role": "assistant", "content": ""})
    try:
        async with aclosing(scanned(started, reader)) as results:
            async for got in results:
                if not isinstance(got, Completion):
                    for p in got:
                        yield chunk(_delta(p))
                    continue
                yield chunk({}, _finish(got, reader))
                if include_usage:
                    used = usage(got, reader.reasoning_tokens)
                    yield event({**head, "choices": [], "usage": used})
    except WarmfleetError as e:  # after the 200: the error travels in the stream
        yield event(error_body(e, Shape.OPENAI))
    yield DONE


async def completions(ctx: HttpContext, request: Request) -> Response:
    body = await ctx.body(request)
    ctx.check_model(get(body, "model", str))
    prompt = get(body, "prompt", (str, list))
    if prompt is None:
        raise InvalidRequestError("prompt", "is required")
    text, ids = (prompt, None) if isinstance(prompt, str) else _prompt_list(prompt)
    inp = GenerateInput(prompt=text, token_ids=ids, **sampling_fields(body, session_of(request)))
    started = await start(ctx, request, inp)
    base = {"id": f"cmpl-{started.job.request_id}", "object": "text_completion",
            "created": started.created, "model": ctx.model_id}  # fmt: skip
    if get(body, "stream", bool, False):
        include_usage = bool(get(body, "stream_options", dict, {}).get("include_usage"))
        return EventStream(_text_chunks(started, base, include_usage), started.headers)  # type: ignore[return-value]
    chunks, c = await collect(started)
    choice = {"index": 0, "text": "".join(ch.text for ch in chunks), "logprobs": None,
              "finish_reason": FINISH[c.finish_reason]}  # fmt: skip
    return JSONResponse({**base, "choices": [choice], "usage": usage(c)}, headers=started.headers)


def _prompt_list(prompt: list[Any]) -> tuple[str | None, list[int] | None]:
    """A list of one string, or a list of token ids."""
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0], None
    if prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return None, list(prompt)
    raise InvalidRequestError("prompt", "a string, a list of one string, or a list of token ids")


async def _text_chunks(
    started: Started, base: dict[str, Any], include_usage: bool
) -> AsyncGenerator[bytes, None]:
    try:
        async with aclosing(started.results) as results:
            async for message in results:
                if isinstance(message, TokenChunk):
                    if message.text:
                        yield event({**base, "choices": [{"index": 0, "text": message.text,
                                                           "finish_reason": None}]})  # fmt: skip
                    continue
                finish = FINISH[message.finish_reason]
                choice = {"index": 0, "text": "", "finish_reason": finish}
                yield event({**base, "choices": [choice]})
                if include_usage:
                    yield event({**base, "choices": [], "usage": usage(message)})
    except WarmfleetError as e:  # after the 200: the error travels in the stream
        yield event(error_body(e, Shape.OPENAI))
    yield DONE


async def models(ctx: HttpContext, request: Request) -> Response:
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "warmfleet"}
            for name in ctx.model_names]  # fmt: skip
    return JSONResponse({"object": "list", "data": data})
