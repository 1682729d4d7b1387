"""Reading a request's JSON (gateway/http_request.py) whatever its depth and its strings, and
the route handler's answers (gateway/http_app.py `answering`): a named error in the API's
shape, an unexpected one a 500 in that shape, logged once with its traceback."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message

from common.errors import InvalidRequestError, NotFoundError
from gateway.http_app import answering
from gateway.http_errors import Shape
from gateway.http_request import json_arguments, read_json

LIMIT = 4 << 20


def request(pieces: list[bytes], disconnect: bool = False, path: str = "/v1/x") -> Request:
    """A POST whose body comes in `pieces`; with `disconnect`, the client leaves after them."""
    messages: list[Message] = [
        {"type": "http.request", "body": p, "more_body": disconnect or i < len(pieces) - 1}
        for i, p in enumerate(pieces)
    ]
    if disconnect:
        messages.append({"type": "http.disconnect"})

    async def receive() -> Message:
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""}
    return Request(scope, receive)


def refusal(pieces: list[bytes], disconnect: bool = False) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as e:
        asyncio.run(read_json(request(pieces, disconnect), LIMIT))
    json.dumps(e.value.field).encode()  # every message can be written back to the client
    str(e.value).encode("utf-8")
    return e.value


@pytest.mark.parametrize("depth", [65, 999, 1_000, 10_000, 1_000_000])
def test_a_body_nested_past_the_bound_is_refused_at_any_depth(depth: int) -> None:
    deep = "[" * depth + "]" * depth
    e = refusal([b'{"messages": ', deep.encode(), b"}"])
    assert "nested deeper than 64 levels" in str(e)
    assert e.field in ("body", "messages" + "[0]" * 63)  # the parser's refusal, or the walk's
    e = refusal([b'{"tools": [{"input_schema": ' + deep.encode() + b"}]}"])
    assert e.field.startswith(("body", "tools[0].input_schema"))


@pytest.mark.parametrize("lone", ["\\ud800", "\\udfff", "a\\ud83dz"])
def test_a_lone_surrogate_is_refused_naming_the_field(lone: str) -> None:
    e = refusal([f'{{"messages": [{{"role": "user", "content": "{lone}"}}]}}'.encode()])
    assert e.field == "messages[0].content" and "lone UTF-16 surrogate" in str(e)
    e = refusal([f'{{"new_session_id": "{lone}"}}'.encode()])
    assert e.field == "new_session_id"


def test_a_sound_body_comes_back_whole() -> None:
    text = '{"messages": [{"role": "user", "content": "\\ud83d\\ude00 é"}], "n": [[[1]]]}'
    body = asyncio.run(read_json(request([text[:9].encode(), text[9:].encode()]), LIMIT))
    assert body == json.loads(text)


def test_a_client_that_leaves_midway_is_a_refusal_not_a_failure() -> None:
    e = refusal([b'{"messa'], disconnect=True)
    assert e.field == "body" and "left" in str(e)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[" * 1_000_000 + "]" * 1_000_000, "nested deeper"),
        ('{"a":' * 65 + "0" + "}" * 65, "nested deeper"),
        ('{"path": "\\ud800"}', "surrogate"),
        ("not json", "not JSON"),
    ],
)
def test_arguments_sent_as_json_text_are_checked_as_a_body_is(text: str, words: str) -> None:
    with pytest.raises(InvalidRequestError, match=words) as e:
        json_arguments(text, "messages", "[1].tool_calls[0].function.arguments")
    assert e.value.field == "messages" and "[1].tool_calls[0]" in str(e.value)


def test_arguments_within_the_bound_are_parsed() -> None:
    assert json_arguments('{"a": [{"b": "é"}]}', "input", "[0].arguments") == {"a": [{"b": "é"}]}
    assert json_arguments("  ", "input", "[0].arguments") == {}


def answer(endpoint: Any, shape: Shape) -> tuple[int, dict[str, Any]]:
    async def call() -> Response:
        return await answering(endpoint, None, shape)(request([b""]))

    response = asyncio.run(call())
    assert isinstance(response, JSONResponse)
    return response.status_code, json.loads(bytes(response.body))


def test_an_unexpected_exception_is_a_500_in_the_shape_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(on: Any, request: Request) -> Response:
        raise TypeError("a bug")

    with caplog.at_level(logging.ERROR, logger="warmfleet.gateway"):
        status, body = answer(broken, Shape.OPENAI)
    assert status == 500 and body["error"]["type"] == "server_error"
    assert body["error"]["code"] == "internal_error" and "a bug" not in body["error"]["message"]
    [record] = caplog.records
    assert record.exc_info is not None and "POST /v1/x" in record.getMessage()
    status, body = answer(broken, Shape.ANTHROPIC)
    assert status == 500 and body["type"] == "error" and body["error"]["type"] == "api_error"


def test_a_named_error_keeps_its_status() -> None:
    async def missing(on: Any, request: Request) -> Response:
        raise NotFoundError("no such session")

    status, body = answer(missing, Shape.ANTHROPIC)
    assert status == 404 and body["error"] == {
        "type": "not_found_error",
        "message": "no such session",
    }
