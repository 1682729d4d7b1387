"""Which part of a reply is reasoning: a `<think>` ... `</think>` span at the reply's start
(Qwen 3, DeepSeek R1; and from the start when the prompt already opened the span, as some
templates' generation prompts do). The splitter reads the reply's text as it streams and
returns its reasoning and its answer apart; a tag anywhere else is text. The reasoning is
trimmed of the white space at its ends, the answer of the white space before it."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from engine.text.chat import THINK_CLOSE, THINK_OPEN
from gateway.tool_calls import partial_suffix


class ReasoningParser(enum.StrEnum):
    AUTO = "auto"  # THINK when the chat template mentions <think>, else NONE
    THINK = "think"
    NONE = "none"


def parses_thoughts(parser: ReasoningParser, template: str | None) -> bool:
    """Whether replies are read for a think span (`--reasoning-parser`)."""
    if parser == ReasoningParser.AUTO:
        return template is not None and THINK_OPEN in template
    return parser == ReasoningParser.THINK


def opens_thought(prompt_tail: str) -> bool:
    """Whether a prompt ending in `prompt_tail` left a think span open for the reply."""
    return prompt_tail.rstrip().endswith(THINK_OPEN)


@dataclass(frozen=True, slots=True)
class Thought:
    """A piece of the reply's reasoning (never empty)."""

    text: str


class _State(enum.Enum):
    START = enum.auto()  # nothing but white space yet: an opening tag may come
    THINKING = enum.auto()
    CLOSED = enum.auto()  # after the closing tag: the answer's white space is dropped
    ANSWER = enum.auto()


class ThoughtSplitter:
    """Feed it the reply's text piece by piece (with the number of tokens each piece came
    from); it returns Thoughts and the answer's text. Only what may be a tag being written,
    and white space that may end the reasoning, is held back. `span_chars` and
    `span_tokens`: how much of the reply, its tags included, the reasoning took (all of it
    while unclosed; 0 for a reply without reasoning)."""

    def __init__(self, enabled: bool = True, inside: bool = False) -> None:
        self.state = _State.THINKING if inside else _State.START
        if not enabled:
            self.state = _State.ANSWER
        self.opened = self.state == _State.THINKING
        self.begun = False  # the reasoning's first characters past its white space came
        self.pending = ""  # text read but not yet returned
        self.at = 0  # the reply's characters before `pending`
        self.span_chars = 0
        self.span_tokens = 0
        self.held_tokens = 0  # those of an undecided start

    def feed(self, text: str, num_tokens: int = 0) -> list[Thought | str]:
        was = self.state
        self.pending += text
        out = self._scan()
        if was == _State.START:
            self.held_tokens += num_tokens
            if self.opened:
                self.span_tokens, self.held_tokens = self.held_tokens, 0
        elif was == _State.THINKING:
            self.span_tokens += num_tokens
        if self.state == _State.THINKING:
            self.span_chars = self.at + len(self.pending)
        return out

    def finish(self) -> list[Thought | str]:
        """What is left at the reply's end: an unclosed span is reasoning to the end."""
        rest, self.pending = self.pending, ""
        if self.state == _State.THINKING:
            thought = rest.rstrip() if self.begun else rest.strip()
            return [Thought(thought)] if thought else []
        if self.state == _State.CLOSED:
            return []  # white space only
        return [rest] if rest else []

    def _scan(self) -> list[Thought | str]:
        out: list[Thought | str] = []
        if self.state == _State.START:
            self._start()
        if self.state == _State.THINKING:
            out += self._think()
        if self.state == _State.CLOSED:
            stripped = self.pending.lstrip()
            self._take(len(self.pending) - len(stripped))
            if stripped:
                self.state = _State.ANSWER
        if self.state == _State.ANSWER and self.pending:
            out.append(self._take(len(self.pending)))
        return out

    def _start(self) -> None:
        stripped = self.pending.lstrip()
        if stripped.startswith(THINK_OPEN):
            self._take(len(self.pending) - len(stripped) + len(THINK_OPEN))
            self.state, self.opened = _State.THINKING, True
        elif not THINK_OPEN.startswith(stripped):  # "" and "<thi" may still open one
            self.state = _State.ANSWER

    def _think(self) -> list[Thought | str]:
        if not self.begun:  # the white space after the opening tag
            self._take(len(self.pending) - len(self.pending.lstrip()))
            self.begun = bool(self.pending)
        end = self.pending.find(THINK_CLOSE)
        if end >= 0:
            thought = self._take(end).rstrip()
            self._take(len(THINK_CLOSE))
            self.span_chars, self.state = self.at, _State.CLOSED
            return [Thought(thought)] if thought else []
        keep = partial_suffix(self.pending, THINK_CLOSE)
        cut = len(self.pending[: len(self.pending) - keep].rstrip())
        return [Thought(self._take(cut))] if cut else []

    def _take(self, n: int) -> str:
        """The first n characters of what is pending, now passed."""
        taken, self.pending = self.pending[:n], self.pending[n:]
        self.at += n
        return taken
