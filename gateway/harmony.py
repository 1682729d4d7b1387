"""gpt-oss's replies in the harmony format, read as they stream: messages of the form
`[<|start|>assistant][ to=RECIPIENT]<|channel|>CHANNEL[ [<|constrain|>]json]<|message|>BODY`
ended by `<|end|>` (another message follows) or by the reply's end (`<|return|>` or
`<|call|>`, the model's stop tokens, which the text does not hold). The `analysis`
channel's bodies are the reply's reasoning, `final`'s (and `commentary`'s without a
recipient: preambles to the user) its text, and a `commentary` message to
`functions.NAME` a call of the offered tool NAME with the body's JSON object as arguments.

What breaks the grammar comes back as the text it was, never as an error or a lost reply:
a reply that does not open with a header, a header cut by the reply's end, an unknown
channel or recipient, a call of a tool not offered or with arguments that are not a JSON
object. The tokenizer keeps harmony's markers in the reply's text for this
(engine/text/tokenizer.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gateway.reasoning import Thought
from gateway.tool_calls import Piece, ToolCall, parsed_json, partial_suffix

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
MARKERS = (START, CHANNEL, MESSAGE, END, "<|constrain|>", "<|call|>", "<|return|>")
CHANNELS = ("analysis", "commentary", "final")
TOOLS = "functions."  # the namespace of the request's tools
OPENINGS = ("<|", " to=")  # what a reply's first header may begin with
MAX_HEADER = 256  # characters a header may take before the reply is read as plain text
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=<\||\s|$)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"(\w+)")

Part = Piece | Thought


def speaks_harmony(template: str | None) -> bool:
    """Whether a chat template writes harmony (gpt-oss's)."""
    return template is not None and CHANNEL in template and MESSAGE in template


@dataclass(frozen=True, slots=True)
class Header:
    channel: str
    recipient: str | None

    @classmethod
    def parse(cls, text: str) -> Header | None:
        """The header of a message (its text before <|message|>); None where it breaks the
        grammar: a role other than the assistant's, no channel or an unknown one."""
        rest = text[len(START) :] if text.startswith(START) else text
        if rest.startswith("assistant"):
            rest = rest[len("assistant") :]
        elif text.startswith(START):
            return None
        channel = _CHANNEL.search(rest)
        if channel is None or channel.group(1) not in CHANNELS or not rest.startswith((" ", "<|")):
            return None
        recipient = _RECIPIENT.search(rest)
        return cls(channel.group(1), recipient.group(1) if recipient else None)


class HarmonyReader:
    """Feed it the reply's text piece by piece (with the number of tokens each came from);
    it returns what to send: reasoning (Thought), text and tool calls. Only what may be a
    marker being written, and a message that may be a call, is held back."""

    def __init__(self, tool_names: frozenset[str]) -> None:
        self.names = tool_names
        self.pending = ""  # text read, not yet returned
        self.header: Header | None = None  # the open message's (None: reading a header)
        self.head_text = ""  # the open message's header as written, <|message|> included
        self.raw = False  # the grammar broke: the rest is text as it comes
        self.num_calls = 0
        self.reasoning_tokens = 0

    def feed(self, text: str, num_tokens: int) -> list[Part]:
        if self.header is not None and self.header.channel == "analysis":
            self.reasoning_tokens += num_tokens
        self.pending += text
        return self._scan()

    def finish(self) -> list[Part]:
        """What is left at the reply's end: the open message whole, or the cut header as
        text."""
        rest, self.pending = self.pending, ""
        if self.raw or self.header is None:
            return [rest] if rest else []
        return self._ended(rest)

    def _scan(self) -> list[Part]:
        out: list[Part] = []
        while self.pending:
            if self.raw:
                out.append(self.pending)
                self.pending = ""
            elif self.header is None:
                if not self._read_header():
                    break
            elif not self._read_body(out):
                break
        return out

    def _read_header(self) -> bool:
        """Take the header before <|message|> when it is whole; False while it is not."""
        at = self.pending.find(MESSAGE)
        if at < 0:
            opening = any(
                self.pending.startswith(o) or o.startswith(self.pending) for o in OPENINGS
            )
            if not opening or len(self.pending) > MAX_HEADER:
                self.raw = True  # not harmony: the text as it is
                return True
            return False
        header = Header.parse(self.pending[:at])
        if header is None:
            self.raw = True
            return True
        self.header, self.head_text = header, self.pending[: at + len(MESSAGE)]
        self.pending = self.pending[at + len(MESSAGE) :]
        return True

    def _read_body(self, out: list[Part]) -> bool:
        """Pass on the open message's body up to <|end|>; False while more may come."""
        at = self.pending.find(END)
        if at >= 0:
            out += self._ended(self.pending[:at])
            self.pending = self.pending[at + len(END) :]
            self.header = None
            return True
        if self._is_call():
            return False  # a call is read whole
        keep = max(partial_suffix(self.pending, m) for m in MARKERS)
        body = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(body) :]
        if body:
            out.append(self._as_sent(body))
        return False

    def _is_call(self) -> bool:
        return self.header is not None and self.header.recipient is not None

    def _as_sent(self, body: str) -> Part:
        assert self.header is not None
        return Thought(body) if self.header.channel == "analysis" else body

    def _ended(self, body: str) -> list[Part]:
        """The rest of the open message's body: a call, or what it streams as."""
        if not self._is_call():
            return [self._as_sent(body)] if body else []
        assert self.header is not None and self.header.recipient is not None
        recipient = self.header.recipient
        name = recipient[len(TOOLS) :] if recipient.startswith(TOOLS) else ""
        arguments = parsed_json(body)
        offered = self.header.channel == "commentary" and name in self.names
        if not offered or not isinstance(arguments, dict):
            return [self.head_text + body]  # the message as it was written
        self.num_calls += 1
        return [ToolCall.new(self.num_calls - 1, name, arguments)]
