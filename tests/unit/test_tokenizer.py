"""The GGUF-built tokenizer against ids and text from the transformers reference."""

import json
from pathlib import Path

import pytest

from common.errors import UnsupportedModelError
from engine.text.gguf_file import open_gguf, read_metadata
from engine.text.tokenizer import Tokenizer
from warmfleet.models import DEFAULT_MODEL_FILE, model_dir, pull_default_model

FIXTURE = Path(__file__).parents[1] / "fixtures" / "tokenizer_cases.json"
CASES = json.loads(FIXTURE.read_text(encoding="utf-8"))["cases"]


@pytest.fixture(scope="module")
def meta():
    path = model_dir() / DEFAULT_MODEL_FILE
    if not path.is_file():
        path = pull_default_model()
    return read_metadata(open_gguf(path))


@pytest.fixture(scope="module")
def tok(meta):
    return Tokenizer.from_metadata(meta)


@pytest.mark.parametrize("case", CASES, ids=[repr(c["text"])[:40] for c in CASES])
def test_matches_reference(tok, case):
    ids = tok.encode(case["text"])
    assert ids == case["ids"]
    assert tok.decode(ids) == case["decoded"]


def test_special_tokens_in_text_are_recognised(tok):
    assert tok.encode("<|im_start|>user\nhi<|im_end|>") == [1, 4093, 198, 6004, 2]
    assert tok.decode([1, 4093, 198, 6004, 2], skip_special=True) == "user\nhi"


def test_ids_and_flags(tok):
    assert tok.vocab_size == 49152
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert tok.eot_ids == frozenset({0, 2})
    assert [i for i in range(tok.vocab_size) if tok.is_special(i)] == list(range(17))
    assert tok.chat_template is not None and "<|im_start|>" in tok.chat_template


def test_token_bytes(tok):
    assert tok.token_bytes(1) == b"<|im_start|>"
    assert tok.token_bytes(198) == b"\n"
    # "😀" is split across two tokens: the first three bytes, then the last one.
    ids = tok.encode("😀")
    assert b"".join(tok.token_bytes(i) for i in ids) == "😀".encode()
    assert all(tok.token_bytes(i) != "😀".encode() for i in ids)


def test_add_bos_token_is_honoured(meta):
    tok = Tokenizer.from_metadata({**meta, "tokenizer.ggml.add_bos_token": True})
    assert tok.encode("hi") == [1, 6004]


@pytest.mark.parametrize(
    ("key", "value"), [("tokenizer.ggml.model", "llama"), ("tokenizer.ggml.pre", "deepseek-llm")]
)
def test_unsupported_tokenizers_are_refused(meta, key, value):
    with pytest.raises(UnsupportedModelError, match=value):
        Tokenizer.from_metadata({**meta, key: value})
