"""The walk that refuses JSON no code should walk (gateway/json_checks.py), the session ids
that come in through gRPC too (common/ids.py), and the model's tool calls that hold such JSON
(gateway/tool_calls.py): text, never a failure mid-stream."""

from __future__ import annotations

import json
from typing import Any

import pytest

from common.errors import InvalidRequestError
from common.ids import check_session_id, require_session_id
from gateway.json_checks import DEEP, MAX_DEPTH, problem
from gateway.tool_calls import ToolCall, ToolCallScanner, calls_of

SURROGATES = ("\ud800", "\udfff", "a\ud83dz")


def nested(depth: int, leaf: Any = 0) -> Any:
    """`depth` lists around `leaf`, built without recursion."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def deep_text(depth: int) -> str:
    """JSON text of `depth` objects: arguments a call would take, but for their depth."""
    return '{"a":' * depth + "0" + "}" * depth


def test_the_bound_is_exact_and_the_path_names_the_place() -> None:
    assert problem({"messages": nested(MAX_DEPTH - 1)}) is None  # the body is a level
    assert problem({"messages": nested(MAX_DEPTH)}) == ("messages" + "[0]" * 63, DEEP)
    assert problem(nested(MAX_DEPTH + 1)) == ("[0]" * MAX_DEPTH, DEEP)


def test_a_value_far_past_the_recursion_limit_is_refused_without_recursing() -> None:
    deep = {"tools": [{"function": {"parameters": nested(200_000)}}]}
    found = problem(deep)
    assert found is not None and found[1] == DEEP
    assert found[0].startswith("tools[0].function.parameters[0]")


@pytest.mark.parametrize("lone", SURROGATES)
def test_a_lone_surrogate_is_refused_in_a_value_or_a_key(lone: str) -> None:
    found = problem({"messages": [{"role": "user", "content": lone}]})
    assert found is not None and found[0] == "messages[0].content"
    assert "lone UTF-16 surrogate" in found[1] and "not text" in found[1]
    found = problem({"tools": [{"input_schema": {"properties": {lone: {}}}}]})
    assert found is not None and "the key" in found[1]
    # the path shows the key escaped: a message with a surrogate could not be written
    path = found[0]
    assert path.startswith("tools[0].input_schema.properties[") and path.isascii()
    json.dumps(found, ensure_ascii=False).encode("utf-8")


def test_text_that_is_text_passes() -> None:
    body = json.loads('{"a": ["\\ud83d\\ude00 é \\u00e9", {"名前": "\\u2028"}], "b": 1.5}')
    assert problem(body) is None
    assert problem("plain") is None and problem(7) is None and problem(None) is None


def test_odd_keys_are_quoted_in_the_path() -> None:
    found = problem({"a b": {"x": "\udfff"}})
    assert found is not None and found[0] == '["a b"].x'


@pytest.mark.parametrize("lone", SURROGATES)
def test_session_ids_with_a_lone_surrogate_are_refused_by_name(lone: str) -> None:
    with pytest.raises(InvalidRequestError, match="lone UTF-16 surrogate") as e:
        require_session_id(lone, "new_session_id")
    assert e.value.field == "new_session_id"


def test_session_ids_keep_their_other_rules() -> None:
    assert check_session_id("agent-é-7") == "agent-é-7"
    assert check_session_id("") == ""
    with pytest.raises(InvalidRequestError, match="control character U\\+0007"):
        check_session_id("a\x07")
    with pytest.raises(InvalidRequestError, match="longer than 128 bytes"):
        check_session_id("é" * 65)  # 65 characters, 130 bytes
    with pytest.raises(InvalidRequestError, match="longer than 128 bytes"):
        check_session_id("x" * 10_000_000 + "\ud800")


NAMES = frozenset({"f"})


def scanned(reply: str) -> tuple[str, list[ToolCall]]:
    return ToolCallScanner(NAMES).whole([reply])


@pytest.mark.parametrize(
    "arguments",
    [
        deep_text(100_000),  # too deep for json.loads
        deep_text(MAX_DEPTH + 1),  # parsed, but past the bound
        '{"a": "\\ud800"}',
        '{"\\udfff": 1}',
    ],
)
def test_a_model_call_holding_json_no_code_should_walk_is_text(arguments: str) -> None:
    for reply in (
        f'<tool_call>{{"name": "f", "arguments": {arguments}}}</tool_call>',
        f'<tool_call>{{"name": "f", "arguments": {json.dumps(arguments)}}}</tool_call>',
        f'{{"name": "f", "arguments": {arguments}}}',  # Llama 3's whole-reply form
        f'[{{"name": "f", "arguments": {arguments}}}]',
    ):
        text, calls = scanned(reply)
        assert calls == [] and text == reply
    assert calls_of(deep_text(100_000), NAMES) is None


def test_a_model_call_within_the_bound_is_a_call() -> None:
    arguments = {"a": nested(MAX_DEPTH - 2, "é")}
    text, calls = scanned(
        f'<tool_call>{{"name": "f", "arguments": {json.dumps(arguments)}}}</tool_call>'
    )
    assert text == "" and [(c.name, c.arguments) for c in calls] == [("f", arguments)]
    assert json.loads(calls[0].arguments_json) == arguments
