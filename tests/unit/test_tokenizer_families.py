"""The Llama 3 and Qwen 2 tokenizers (GGUF `tokenizer.ggml.pre` llama-bpe and qwen2) against
llama.cpp's own test vectors for each real vocabulary (tests/reference/make_vocab_fixture.py)."""

from __future__ import annotations

from typing import Any

import pytest

from common.errors import UnsupportedModelError
from engine.text.tokenizer import Tokenizer
from tests.tiny_families import FAMILIES, family_vocab

BEGIN_OF_TEXT, END_OF_TEXT = 128000, 128001
START_HEADER, END_HEADER, EOT = 128006, 128007, 128009


@pytest.fixture(scope="module")
def fixture() -> dict[str, Any]:
    data = family_vocab("llama3")
    assert data["metadata"]["tokenizer.ggml.pre"] == "llama-bpe"
    assert len(data["metadata"]["tokenizer.ggml.tokens"]) == 128256
    return data


@pytest.fixture(scope="module")
def llama3(fixture: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_metadata(fixture["metadata"])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_llama_cpp_case_gives_its_ids_and_decodes_back(family: str) -> None:
    data = family_vocab(family)
    tokenizer = Tokenizer.from_metadata(data["metadata"])
    cases = data["cases"]
    assert len(cases) >= 40  # spaces, tabs, newlines, digits, contractions, CJK, emoji, code
    wrong = [(text, ids, got) for text, ids in cases if (got := tokenizer.encode(text)) != ids]
    assert not wrong, wrong[:3]
    assert all(tokenizer.decode(ids) == text for text, ids in cases)


def test_qwen_splits_every_digit_and_ends_turns_on_im_end() -> None:
    qwen = Tokenizer.from_metadata(family_vocab("qwen2")["metadata"])
    pieces = [qwen.token_bytes(i) for i in qwen.encode("1234 apples")]
    assert pieces == [b"1", b"2", b"3", b"4", b" apples"]
    im_end = qwen.encode("<|im_end|>")
    assert len(im_end) == 1 and im_end[0] in qwen.eot_ids and qwen.is_special(im_end[0])


def test_digits_go_in_threes_and_whole_words_skip_the_merges(llama3: Tokenizer) -> None:
    # what separates Llama 3's split from GPT-2's: runs of digits in threes
    pieces = [llama3.token_bytes(i) for i in llama3.encode("1234567 apples")]
    assert pieces == [b"123", b"456", b"7", b" apples"]


def test_the_chat_markup_is_single_control_tokens_and_turns_end_on_eot(
    llama3: Tokenizer,
) -> None:
    ids = llama3.encode("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>")
    assert ids[0] == START_HEADER and ids[2] == END_HEADER and ids[-1] == EOT
    assert llama3.is_special(EOT) and not llama3.is_special(ids[1])
    assert {EOT, END_OF_TEXT} <= llama3.eot_ids


def test_bos_comes_first_when_the_file_asks(fixture: dict[str, Any]) -> None:
    meta = {**fixture["metadata"], "tokenizer.ggml.add_bos_token": True}
    assert Tokenizer.from_metadata(meta).encode("Hi")[0] == BEGIN_OF_TEXT


def test_other_pre_tokenizers_are_refused_by_name(fixture: dict[str, Any]) -> None:
    meta = {**fixture["metadata"], "tokenizer.ggml.pre": "deepseek-llm"}
    with pytest.raises(UnsupportedModelError, match=r"pre='deepseek-llm' is not supported.*qwen2"):
        Tokenizer.from_metadata(meta)
