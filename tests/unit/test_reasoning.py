"""The think-span splitter (gateway/reasoning.py): the same reasoning and answer however
the reply's text is cut into chunks, the span's length in characters and tokens, a span
left open, a prompt that opened it, tags that are text; and which templates get it."""

from __future__ import annotations

import pytest

from gateway.reasoning import (
    ReasoningParser,
    Thought,
    ThoughtSplitter,
    opens_thought,
    parses_thoughts,
)

REPLY = "<think>\nThe user wants 2 + 2.\n</think>\n\nIt is 4."


def run(pieces: list[str], **kw: bool) -> tuple[str, str, ThoughtSplitter, list[int]]:
    """The reasoning and the answer the pieces give (a token each), the splitter after,
    and how many Thoughts each feed returned."""
    splitter = ThoughtSplitter(**kw)
    out: list[Thought | str] = []
    counts = []
    for piece in pieces:
        got = splitter.feed(piece, 1)
        counts.append(sum(isinstance(p, Thought) for p in got))
        out += got
    out += splitter.finish()
    assert all(p.text if isinstance(p, Thought) else p for p in out)  # nothing empty
    thought = "".join(p.text for p in out if isinstance(p, Thought))
    return thought, "".join(p for p in out if isinstance(p, str)), splitter, counts


def splits(text: str) -> list[list[str]]:
    """The text whole, cut in two at every position, in three at every pair, and one
    character a piece."""
    n = len(text)
    cuts = [[text[:i], text[i:]] for i in range(1, n)]
    threes = [[text[:i], text[i:j], text[j:]] for i in range(1, n) for j in range(i + 1, n)]
    return [[text], *cuts, *threes, list(text)]


def test_the_span_splits_the_same_at_every_chunk_boundary() -> None:
    end = REPLY.index("</think>") + len("</think>")
    for pieces in splits(REPLY):
        thought, answer, s, _ = run(pieces)
        assert (thought, answer) == ("The user wants 2 + 2.", "It is 4."), pieces
        assert s.span_chars == end, pieces
        # the tokens of every piece up to the one that closes the span
        closing = next(i for i in range(len(pieces)) if len("".join(pieces[: i + 1])) >= end)
        assert s.span_tokens == closing + 1, pieces


def test_reasoning_streams_before_its_end_and_holds_only_a_possible_tag() -> None:
    s = ThoughtSplitter()
    assert s.feed("<think>I add") == [Thought("I add")]
    assert s.feed(" them.\n</th") == [Thought(" them.")]  # "\n</th" may close it: held
    assert s.feed("is is not the end") == [Thought("\n</this is not the end")]
    assert s.feed("</think>") == []
    assert s.feed("\n\n") == []
    assert s.feed("Four.") == ["Four."]


def test_a_reply_without_the_tag_passes_as_it_came() -> None:
    for text in ("  Hello <think>x</think>", "<thinking about it", "<b>bold</b>", " \n"):
        for pieces in splits(text):
            thought, answer, s, _ = run(pieces)
            assert (thought, answer, s.span_chars, s.span_tokens) == ("", text, 0, 0), pieces


def test_an_unclosed_span_is_reasoning_to_the_end() -> None:
    text = "<think>\nStill thinking when max_tokens came\n"
    for pieces in splits(text):
        thought, answer, s, _ = run(pieces)
        assert (thought, answer) == ("Still thinking when max_tokens came", ""), pieces
        assert s.span_chars == len(text) and s.span_tokens == len(pieces)


def test_a_prompt_that_opened_the_span_starts_the_reply_in_it() -> None:
    assert opens_thought("<|im_start|>assistant\n<think>\n")
    assert not opens_thought("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_thought("<|im_start|>assistant\n")
    text = "Two and two.\n</think>\n\nFour."
    for pieces in splits(text):
        thought, answer, s, _ = run(pieces, inside=True)
        assert (thought, answer) == ("Two and two.", "Four."), pieces
        assert s.span_chars == text.index("\n\nFour")


def test_tags_in_code_or_past_the_start_are_text() -> None:
    for code in ("Write `<think>x</think>` in the file.", "```\n<think>\n```"):
        for pieces in splits(code):
            thought, answer, s, _ = run(pieces)
            assert (thought, answer, s.span_chars) == ("", code, 0), pieces
    # inside the reasoning, an opening tag is text; the first closing tag ends it
    thought, answer, _, _ = run(["<think>a <think> b</think>c</think>"])
    assert (thought, answer) == ("a <think> b", "c</think>")


def test_an_empty_span_gives_no_reasoning() -> None:
    for pieces in splits("<think>\n\n</think>\n\nHi"):
        thought, answer, s, counts = run(pieces)
        assert (thought, answer, s.span_chars) == ("", "Hi", len("<think>\n\n</think>")), pieces
        assert counts == [0] * len(pieces)


def test_switched_off_everything_is_the_answer() -> None:
    assert run([REPLY], enabled=False)[:2] == ("", REPLY)


@pytest.mark.parametrize(
    ("parser", "template", "expected"),
    [
        (ReasoningParser.AUTO, "{{ '<think>\\n' }}", True),
        (ReasoningParser.AUTO, "{{ messages }}", False),
        (ReasoningParser.AUTO, None, False),
        (ReasoningParser.THINK, "{{ messages }}", True),
        (ReasoningParser.NONE, "{{ '<think>' }}", False),
    ],
)
def test_auto_thinks_when_the_template_mentions_the_tag(
    parser: ReasoningParser, template: str | None, expected: bool
) -> None:
    assert parses_thoughts(parser, template) is expected
