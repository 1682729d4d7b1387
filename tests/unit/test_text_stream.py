"""TextStream: stop strings spanning tokens are cut exactly; held text is released when safe."""

from __future__ import annotations

import pytest

from engine.text.detokenizer import StreamDecoder
from engine.text.text_stream import TextStream

PIECES: list[bytes] = [
    b"Hel",
    b"lo",
    b" wor",
    b"ld",
    b"</",
    b"s",
    b">",
    b" tail",
    b"<",
    b"/x",
    b"\xe6\x97",
    b"\xa5",
    b"END",
    b"!",
    b"ab</s>cd",
    b"<|im_end|>",
]
SPECIAL = {len(PIECES) - 1}


class Pieces:
    """A token source whose token i is PIECES[i]; the last one is a control token."""

    def token_bytes(self, token_id: int) -> bytes:
        return PIECES[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in SPECIAL


def ids(*pieces: bytes) -> list[int]:
    return [PIECES.index(p) for p in pieces]


def run(token_ids: list[int], stop: tuple[str, ...]) -> tuple[list[str], bool, int]:
    """Every push's text plus the finish text, whether a stop was hit, and after how many
    tokens (the stream is not pushed past a stop, as the engine does)."""
    stream = TextStream(StreamDecoder(Pieces()), stop)
    out: list[str] = []
    for n, token in enumerate(token_ids, start=1):
        text, stopped = stream.push(token)
        out.append(text)
        if stopped:
            return out, True, n
    text, stopped = stream.finish()
    assert not stopped
    return [*out, text], False, len(token_ids)


def test_stop_spanning_three_tokens_is_cut_exactly() -> None:
    pieces, stopped, n = run(ids(b"Hel", b"lo", b"</", b"s", b">", b" tail"), ("</s>",))
    assert stopped and n == 5
    assert "".join(pieces) == "Hello"
    # nothing that could begin "</s>" was released early
    assert pieces[-1] == "" or not any("<" in p for p in pieces)


def test_stop_inside_one_token_keeps_the_text_before_it() -> None:
    pieces, stopped, n = run(ids(b"Hel", b"ab</s>cd", b"lo"), ("</s>",))
    assert stopped and n == 2
    assert "".join(pieces) == "Helab"


def test_earliest_of_several_stops_wins() -> None:
    pieces, stopped, _ = run(ids(b"Hel", b"lo", b" wor", b"ld"), ("ld", "lo w"))
    assert stopped and "".join(pieces) == "Hel"


def test_held_text_that_is_not_a_stop_is_released() -> None:
    token_ids = ids(b"Hel", b"lo", b"<", b"/x", b" wor", b"ld")
    pieces, stopped, _ = run(token_ids, ("</s>",))
    assert not stopped
    assert "".join(pieces) == "Hello</x world"
    # after each token the text sent so far is a prefix of the whole, short of at most
    # len("</s>") - 1 characters, and all of it once the stream ends
    decoded = ""
    sent = ""
    for token, piece in zip(token_ids, pieces, strict=False):
        decoded += PIECES[token].decode()
        sent += piece
        assert decoded.startswith(sent) and len(decoded) - len(sent) <= 3
    assert pieces[-1] == "rld"


def test_held_text_is_released_at_finish() -> None:
    pieces, stopped, _ = run(ids(b"Hel", b"lo", b"</", b"s"), ("</s>",))
    assert not stopped
    assert "".join(pieces) == "Hello</s"
    assert pieces[-1].endswith("</s")


def test_no_stop_emits_everything_at_once() -> None:
    token_ids = ids(b"Hel", b"lo", b"</", b"s", b">", b" tail")
    pieces, stopped, _ = run(token_ids, ())
    assert not stopped
    assert pieces == ["Hel", "lo", "</", "s", ">", " tail", ""]


def test_split_utf8_character_is_held_and_a_stop_after_it_still_cuts() -> None:
    pieces, stopped, _ = run(ids(b"\xe6\x97", b"\xa5", b"END", b"!"), ("END",))
    assert stopped and "".join(pieces) == "日"
    pieces, stopped, _ = run(ids(b"\xe6\x97", b"\xa5", b"!"), ())
    assert pieces == ["", "日", "!", ""]


def test_stop_made_of_a_character_split_across_tokens() -> None:
    pieces, stopped, n = run(ids(b"Hel", b"\xe6\x97", b"\xa5", b"!"), ("日",))
    assert stopped and n == 3 and "".join(pieces) == "Hel"


def test_special_tokens_add_no_text() -> None:
    pieces, stopped, _ = run(ids(b"Hel", b"<|im_end|>", b"lo"), ("<|im_end|>",))
    assert not stopped and "".join(pieces) == "Hello"


@pytest.mark.parametrize("stop", ["</s>", "Hello", "o", "lo</s> tail"])
def test_cut_matches_str_find(stop: str) -> None:
    token_ids = ids(b"Hel", b"lo", b"</", b"s", b">", b" tail")
    full = "Hello</s> tail"
    pieces, stopped, _ = run(token_ids, (stop,))
    assert stopped and "".join(pieces) == full[: full.find(stop)]
