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
from gateway.http_jobs import HttpContext, Started, collect, start
from gateway.http_request import Body, get, number, session_of, string_list
from gateway.sse import DONE, EventStream, event
from gateway.validate import GenerateInput

FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length",
          FinishReason.CANCELLED: "stop"}  # fmt: skip


def chat_messages(body: Body) -> list[dict[str, str]]:
    """`messages`, each content a string or a list of text parts, flattened to strings."""
    raw = get(body, "messages", list)
    if raw is None:
        raise InvalidRequestError("messages", "is required")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InvalidRequestError("messages", f"[{i}]: must be an object")
        role, content = m.get("role"), m.get("content")
        if isinstance(content, list):
            parts = [p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None
                     for p in content]  # fmt: skip
            if any(not isinstance(p, str) for p in parts):
                raise InvalidRequestError("messages", f"[{i}].content: only text parts")
            content = "".join(p for p in parts if p is not None)
        role = "system" if role == "developer" else role
        messages.append({"role": role, "content": content})
    return messages  # type: ignore[return-value]  # roles and contents: checked as any chat


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
        "stop": string_list(body, "stop"),
        "priority": Priority(priority),
        "ignore_eos": get(body, "ignore_eos", bool, False),
        "min_tokens": get(body, "min_tokens", int, 0),
    }


def usage(c: Completion) -> dict[str, Any]:
    u = c.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


async def chat_completions(ctx: HttpContext, request: Request) -> Response:
    body = await ctx.body(request)
    ctx.check_model(get(body, "model", str))
    stream = get(body, "stream", bool, False)
    options = get(body, "stream_options", dict, {})
    inp = GenerateInput(messages=chat_messages(body), **sampling_fields(body, session_of(request)))
    started = await start(ctx, request, inp)
    base = {"id": f"chatcmpl-{started.job.request_id}", "created": started.created,
            "model": ctx.model_id}  # fmt: skip
    if stream:
        chunks = _chat_chunks(started, base, bool(options.get("include_usage")))
        return EventStream(chunks, started.headers)  # type: ignore[return-value]
    chunks_got, c = await collect(started)
    message = {"role": "assistant", "content": "".join(ch.text for ch in chunks_got)}
    choice = {"index": 0, "message": message, "finish_reason": FINISH[c.finish_reason],
              "logprobs": None}  # fmt: skip
    return JSONResponse(
        {**base, "object": "chat.completion", "choices": [choice], "usage": usage(c)},
        headers=started.headers,
    )


async def _chat_chunks(
    started: Started, base: dict[str, Any], include_usage: bool
) -> AsyncGenerator[bytes, None]:
    head = {**base, "object": "chat.completion.chunk"}

    def chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return event({**head, "choices": [choice]})

    yield chunk({"role": "assistant", "content": ""})
    try:
        async with aclosing(started.results) as results:
            async for message in results:
                if isinstance(message, TokenChunk):
                    if message.text:
                        yield chunk({"content": message.text})
                    continue
                yield chunk({}, FINISH[message.finish_reason])
                if include_usage:
                    yield event({**head, "choices": [], "usage": usage(message)})
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
