"""Tool calls in a reply's text: found whole however the text is split, text around them
passed through, and anything that is not a call of an offered tool left as the text it was."""

from __future__ import annotations

import itertools
import json

import pytest

from gateway.tool_calls import ToolCall, ToolCallScanner, merge_text

NAMES = frozenset({"get_weather", "read_file"})
PLAIN = "plain text, a <tool_caller> and a < sign"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def scan(text: str, splits: list[int], names: frozenset[str] = NAMES) -> list[str | ToolCall]:
    """The pieces out of `text` fed in parts cut at `splits`."""
    scanner = ToolCallScanner(names)
    cuts = [0, *splits, len(text)]
    pieces = []
    for a, b in itertools.pairwise(cuts):
        pieces += scanner.feed(text[a:b])
    return pieces + scanner.finish()


def every_split(text: str) -> list[list[int]]:
    """Fed whole, a character at a time, and cut once at every place."""
    return [[], list(range(1, len(text))), *[[i] for i in range(1, len(text))]]


def calls_of(pieces: list[str | ToolCall]) -> list[tuple[int, str, dict]]:
    return [(p.index, p.name, p.arguments) for p in pieces if isinstance(p, ToolCall)]


@pytest.mark.parametrize(
    ("reply", "text", "calls"),
    [
        (CALL, "", [(0, "get_weather", {"city": "Paris"})]),
        ("Let me look.\n" + CALL + "\n", "Let me look.", [(0, "get_weather", {"city": "Paris"})]),
        (
            CALL + "\n" + CALL.replace("get_weather", "read_file"),
            "",
            [(0, "get_weather", {"city": "Paris"}), (1, "read_file", {"city": "Paris"})],
        ),
        # Llama 3's form: the whole reply one object, "parameters" for the arguments
        (' {"name": "read_file", "parameters": {"path": "a.py"}}', "",
         [(0, "read_file", {"path": "a.py"})]),
        # Mistral's form: a list of calls
        (' [{"name": "read_file", "arguments": {"path": "a"}}, {"name": "get_weather", '
         '"arguments": {}}]', "", [(0, "read_file", {"path": "a"}), (1, "get_weather", {})]),
        # arguments written as a JSON string
        ('<tool_call>{"name": "read_file", "arguments": "{\\"path\\": \\"b\\"}"}</tool_call>', "",
         [(0, "read_file", {"path": "b"})]),
        # an unclosed block at the reply's end (the model stopped before the tag)
        ('<tool_call>\n{"name": "read_file", "arguments": {}}\n', "", [(0, "read_file", {})]),
        (PLAIN, PLAIN, []),
    ],
)  # fmt: skip
def test_calls_are_found_however_the_text_is_split(reply: str, text: str, calls: list) -> None:
    for splits in every_split(reply):
        pieces = scan(reply, splits)
        assert merge_text(pieces)[0] == text, splits
        assert calls_of(pieces) == calls, splits


@pytest.mark.parametrize(
    "block",
    [
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',  # a tool not offered
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "read_file", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "read_file", "arguments": {}',  # cut off by the length limit
    ],
)
def test_what_is_not_a_call_stays_text(block: str) -> None:
    for splits in every_split(block):
        pieces = scan("A " + block, [s + 2 for s in splits])
        assert calls_of(pieces) == []
        assert merge_text(pieces)[0] == "A " + block


@pytest.mark.parametrize(
    "reply",
    ['{"answer": 42}', '[{"name": "read_file", "arguments": {}}, {"name": "rm"}]', "[]", "[1] x"],
)
def test_a_reply_that_is_json_but_no_call_comes_out_whole(reply: str) -> None:
    for splits in every_split(reply):
        assert merge_text(scan(reply, splits)) == (reply, [])


def test_text_streams_at_once_but_for_what_may_open_a_block() -> None:
    scanner = ToolCallScanner(NAMES)
    assert scanner.feed("Hello") == ["Hello"]
    assert scanner.feed(" world <tool") == [" world"]
    assert scanner.feed("box>") == [" <toolbox>"]
    assert scanner.feed("\n") == []  # white space waits: a block may follow it
    out = scanner.feed(CALL)
    assert [(p.index, p.name) for p in out if isinstance(p, ToolCall)] == [(0, "get_weather")]
    assert len(out) == 1  # the white space before the call is dropped
    assert scanner.feed(" Done.") == [" Done."]
    assert scanner.finish() == []
    assert scanner.calls == 1


def test_without_tools_the_text_passes_through_untouched() -> None:
    scanner = ToolCallScanner(frozenset())
    assert scanner.feed("{") == ["{"]
    assert scanner.feed(" <tool_call>") == [" <tool_call>"]
    assert scanner.feed("") == []
    assert scanner.finish() == []


def test_each_call_has_its_own_id_and_json_arguments() -> None:
    pieces = scan(CALL + CALL, [])
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    assert len(calls) == 2 and calls[0].id != calls[1].id
    assert all(len(c.id) == 24 and int(c.id, 16) >= 0 for c in calls)
    assert json.loads(calls[0].arguments_json) == {"city": "Paris"}
