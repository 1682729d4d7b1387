"""Streaming detokenization equals a full decode, holding back partial UTF-8 characters."""

import random

import pytest

from engine.text.detokenizer import StreamDecoder
from engine.text.tokenizer import Tokenizer


def gpt2_byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte, as byte-level vocabs spell tokens."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable} | {b: chr(256 + n) for n, b in enumerate(others)}
    return [chars[b] for b in range(256)]


BYTE_CHARS = gpt2_byte_chars()


def spell(raw: bytes) -> str:
    return "".join(BYTE_CHARS[b] for b in raw)


@pytest.fixture(scope="module")
def tok():
    """A tiny byte-level vocab whose merges cut characters apart: "😀" is F0 9F 98 | 80, and
    "日本" (E6 97 A5 E6 9C AC) is E6 97 | A5 E6 | 9C | AC."""
    control = ["<|endoftext|>", "<|im_end|>"]
    pairs = [(b"\xf0", b"\x9f"), (b"\xf0\x9f", b"\x98"), (b"\xe6", b"\x97"), (b"\xa5", b"\xe6")]
    merges = [f"{spell(a)} {spell(b)}" for a, b in pairs]
    byte_tokens = [spell(bytes([b])) for b in range(256)]
    merged = [spell(a + b) for a, b in pairs]
    tokens = control + byte_tokens + merged
    return Tokenizer.from_metadata(
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "smollm",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3, 3] + [1] * (len(tokens) - 2),
            "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.eos_token_id": 1,
        }
    )


def stream(tok, ids, skip_special=True):
    decoder = StreamDecoder(tok, skip_special=skip_special)
    return [decoder.push(i) for i in ids], decoder.flush()


def test_vocab_cuts_characters(tok):
    assert [tok.token_bytes(i) for i in tok.encode("😀")] == [b"\xf0\x9f\x98", b"\x80"]
    assert [tok.token_bytes(i) for i in tok.encode("日本")] == [
        b"\xe6\x97",
        b"\xa5\xe6",
        b"\x9c",
        b"\xac",
    ]


def test_partial_characters_are_held_back(tok):
    pieces, rest = stream(tok, tok.encode("a😀日本b"))
    assert pieces == ["a", "", "😀", "", "日", "", "本", "b"]
    assert rest == ""


@pytest.mark.parametrize("skip_special", [True, False])
def test_random_emoji_and_cjk_streams_equal_decode(tok, skip_special):
    rng = random.Random(7)
    alphabet = ["a", " ", "\n", "😀", "日", "本", "語", "é", "👍🏽", "<|im_end|>", "<|endoftext|>"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        ids = tok.encode(text)
        pieces, rest = stream(tok, ids, skip_special)
        assert "".join(pieces) + rest == tok.decode(ids, skip_special=skip_special)
        assert "\ufffd" not in "".join(pieces) + rest


def test_special_tokens_are_skipped_or_kept(tok):
    ids = tok.encode("hi<|im_end|>")
    assert stream(tok, ids)[0][-1] == ""
    assert stream(tok, ids, skip_special=False)[0][-1] == "<|im_end|>"


def test_unfinished_character_becomes_replacement_only_at_flush(tok):
    first_of_emoji = tok.encode("😀")[0]
    pieces, rest = stream(tok, [*tok.encode("ok"), first_of_emoji])
    assert pieces == ["o", "k", ""]
    assert rest == "\ufffd"
    assert "".join(pieces) + rest == tok.decode([*tok.encode("ok"), first_of_emoji])


def test_bytes_that_cannot_start_a_character_match_decode(tok):
    stray = tok.encode("😀")[1]  # a lone continuation byte 0x80
    ids = [stray, *tok.encode("x"), tok.encode("日本")[0], *tok.encode("y")]
    pieces, rest = stream(tok, ids)
    assert "".join(pieces) + rest == tok.decode(ids) == "\ufffdx\ufffdy"
