"""Tool calls found in a reply's text as it streams: `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>` blocks (the Hermes form: Hermes 3, and the form warmfleet's own tool
prompt asks for), or a whole reply that is one JSON object with "name" and "parameters" or
"arguments" (Llama 3's form) or a list of them (Mistral's, after its [TOOL_CALLS] token).
Text around the calls passes through at once, but for the few characters that might open a
block; a block that does not hold a call of a tool the request offered comes out as the text
it was."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.text.chat_tools import CALL_CLOSE, CALL_OPEN
from gateway.json_checks import problem


@dataclass(frozen=True, slots=True)
class ToolCall:
    index: int  # the reply's first call is 0
    id: str  # 24 hex digits; each API puts its prefix before them
    name: str
    arguments: dict[str, Any]

    @classmethod
    def new(cls, index: int, name: str, arguments: dict[str, Any]) -> ToolCall:
        """The reply's call number `index`, with a fresh id."""
        return cls(index, uuid.uuid4().hex[:24], name, arguments)

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


Piece = str | ToolCall


def calls_of(text: str, names: frozenset[str]) -> list[tuple[str, dict[str, Any]]] | None:
    """The calls of a whole reply that is a call object or a non-empty list of them."""
    value = parsed_json(text)
    values = value if isinstance(value, list) else [value]
    found = [call for call in (_call_in(v, names) for v in values) if call is not None]
    return found if found and len(found) == len(values) else None


def call_of(text: str, names: frozenset[str]) -> tuple[str, dict[str, Any]] | None:
    """The tool and arguments a JSON object names, when it is an offered tool with object
    arguments."""
    return _call_in(parsed_json(text), names)


def parsed_json(text: str) -> Any:
    """The JSON value of the model's text; None where it is no JSON, or JSON that no code
    should walk (too deep to parse or to write again, a lone surrogate): text, not a call."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return None if problem(value) is not None else value


def _call_in(value: Any, names: frozenset[str]) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        arguments = parsed_json(arguments)
    if not isinstance(arguments, dict):
        return None
    return value["name"], arguments


class ToolCallScanner:
    """Feed it the reply's text piece by piece; it returns what to send: text and calls.
    With no tools offered the text passes through as it comes."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.pending = ""  # text held back: a block being read, or what might open one
        self.inside = False
        self.gap = ""  # the white space before the open block: dropped if it holds a call
        self.started = False  # anything but white space seen
        self.whole_json = False  # the reply opened with "{": held to the end (Llama 3's form)
        self.calls = 0

    @classmethod
    def offering(cls, tools: list[dict[str, Any]] | None) -> ToolCallScanner:
        """The scanner for a request's tools (engine/text/chat_tools.py's form; None: none)."""
        return cls(frozenset(t["function"]["name"] for t in tools or ()))

    def feed(self, text: str) -> list[Piece]:
        if not self.names:
            return [text] if text else []
        self.pending += text
        if not self.started:
            stripped = self.pending.lstrip()
            if stripped in ("", "["):  # "[" may open a list of calls: wait for the next
                return []
            self.started = True
            self.whole_json = stripped.startswith(("{", "[{"))
        if self.whole_json:
            return []
        return self._scan()

    def whole(self, texts: Iterable[str]) -> tuple[str, list[ToolCall]]:
        """A reply read at once: its text and its calls."""
        return merge_text([p for text in texts for p in self.feed(text)] + self.finish())

    def finish(self) -> list[Piece]:
        """What is left at the reply's end: an unclosed block is tried as a call."""
        rest, self.pending = self.pending, ""
        if self.whole_json:
            found = calls_of(rest, self.names)
            return [self._new(*call) for call in found] if found else [rest]
        if self.inside:
            return [self._call(rest[len(CALL_OPEN) :], self.gap + rest)]
        return [rest] if rest.strip() or (rest and not self.calls) else []

    def _scan(self) -> list[Piece]:
        out: list[Piece] = []
        while True:
            if not self.inside:
                at = self.pending.find(CALL_OPEN)
                if at < 0:
                    # held: what may open a block, and white space that may stand before one
                    keep = partial_suffix(self.pending, CALL_OPEN)
                    cut = len(self.pending[: len(self.pending) - keep].rstrip())
                    if cut:
                        out.append(self.pending[:cut])
                        self.pending = self.pending[cut:]
                    return out
                head = self.pending[:at].rstrip()
                if head:
                    out.append(head)
                self.gap = self.pending[len(head) : at]
                self.pending = self.pending[at:]
                self.inside = True
            end = self.pending.find(CALL_CLOSE)
            if end < 0:
                return out
            block = self.pending[: end + len(CALL_CLOSE)]
            self.pending = self.pending[end + len(CALL_CLOSE) :]
            self.inside = False
            out.append(self._call(block[len(CALL_OPEN) : end], self.gap + block))

    def _call(self, json_text: str, as_written: str) -> Piece:
        """The call `json_text` holds, else the text as it was written."""
        found = call_of(json_text, self.names)
        return as_written if found is None else self._new(*found)

    def _new(self, name: str, arguments: dict[str, Any]) -> ToolCall:
        self.calls += 1
        return ToolCall.new(self.calls - 1, name, arguments)


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def merge_text(pieces: list[Piece]) -> tuple[str, list[ToolCall]]:
    """All the pieces of a reply: its text, and its calls."""
    text = "".join(p for p in pieces if isinstance(p, str))
    return text, [p for p in pieces if isinstance(p, ToolCall)]
