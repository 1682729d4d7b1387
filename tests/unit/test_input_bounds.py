"""The byte bound (gateway/bounds.py): a text whose size alone shows it cannot fit the context
is refused without being tokenized, and the bound never refuses a text that fits."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from common.errors import PromptTooLargeError, PromptTooLongError
from engine.model import Model
from engine.text.gguf_file import open_gguf, read_metadata
from engine.text.model_config import ModelConfig
from engine.text.tokenizer import Tokenizer
from gateway.bounds import InputBounds, utf8_size
from gateway.validate import GenerateInput, JobBuilder, input_size
from gateway.work_gate import WorkGate

BOUNDS = InputBounds(context_length=11, max_token_bytes=4)  # 10 prompt tokens, 40 bytes


def test_the_bound_is_the_prompt_tokens_times_the_longest_token() -> None:
    assert BOUNDS.max_tokens_in == 10 and BOUNDS.max_prompt_bytes == 40
    assert BOUNDS.check_text("prompt", ["x" * 40]) == 40
    with pytest.raises(PromptTooLargeError) as err:
        BOUNDS.check_text("prompt", ["x" * 41])
    assert str(err.value).startswith("prompt: 41 bytes of text or more cannot fit a context")
    assert "at most 40 bytes can (10 tokens of at most 4 bytes" in str(err.value)


def test_bytes_are_counted_in_utf8_and_across_messages() -> None:
    assert utf8_size("é" * 10, 100) == 20 and utf8_size("ab", 100) == 2
    assert utf8_size("é" * 50, 10) > 10  # over the limit: the characters alone tell
    assert BOUNDS.check_text("messages", ["é" * 10, "x" * 20]) == 40
    with pytest.raises(PromptTooLargeError, match=r"^messages: "):
        BOUNDS.check_text("messages", ["é" * 10, "x" * 21])
    with pytest.raises(PromptTooLargeError):
        BOUNDS.check_text("prompt", ["\U0001f600" * 11])  # 44 bytes in 11 characters


def test_counts_over_the_context_are_refused() -> None:
    BOUNDS.check_count("messages", 10)
    with pytest.raises(PromptTooLargeError, match="11 messages cannot fit"):
        BOUNDS.check_count("messages", 11)
    with pytest.raises(PromptTooLongError, match="11 tokens do not fit"):
        BOUNDS.check_count("token_ids", 11)


def test_an_encoded_request_is_refused_past_its_largest_possible_size() -> None:
    limit = BOUNDS.max_request_bytes
    assert limit > BOUNDS.max_prompt_bytes
    assert BOUNDS.check_request(limit) is None
    why = BOUNDS.check_request(limit + 1)
    assert why is not None and f"the request has {limit + 1} bytes" in why


def test_input_size_refuses_each_kind_of_input() -> None:
    assert input_size(GenerateInput(prompt="x" * 40), BOUNDS) == 40
    assert input_size(GenerateInput(token_ids=[1] * 10), BOUNDS) == 10
    messages = [{"role": "user", "content": "x" * 30}, {"role": "user", "content": "y" * 11}]
    with pytest.raises(PromptTooLargeError, match=r"^messages: "):
        input_size(GenerateInput(messages=messages), BOUNDS)
    with pytest.raises(PromptTooLargeError, match=r"^messages: 11 messages"):
        input_size(GenerateInput(messages=[{"role": "user", "content": ""}] * 11), BOUNDS)
    with pytest.raises(PromptTooLongError):
        input_size(GenerateInput(token_ids=[1] * 11), BOUNDS)


@pytest.mark.parametrize(
    "text",
    ["<|im_end|>", " ", "ab", "x", "\n  ", "é", "\U0001f600", "<|im_start|>user\nhi<|im_end|>"],
)
def test_the_bound_is_sound_for_the_tokenizer(tiny_model: Model, text: str) -> None:
    """No text has fewer tokens than its bytes over the longest token: the bound refuses
    nothing that fits (the texts repeat the vocabulary's longest tokens, whitespace runs)."""
    tok = tiny_model.tokenizer
    bounds = InputBounds.of(tok, tiny_model.config)
    longest = max(len(tok.token_bytes(i)) for i in range(tok.vocab_size))
    assert bounds.max_token_bytes == longest and bounds.context_length == 256
    for repeats in (1, 7, 200):
        piece = text * repeats
        num_bytes = len(piece.encode())
        assert len(tok.encode(piece)) * bounds.max_token_bytes >= num_bytes


def test_the_default_models_bound(default_model_path: Path) -> None:
    meta = read_metadata(open_gguf(default_model_path))
    tokenizer = Tokenizer.from_metadata(meta)
    bounds = InputBounds.of(tokenizer, ModelConfig.from_metadata(meta))
    # the longest token of SmolLM2's vocabulary is a newline and 80 spaces
    assert (bounds.max_token_bytes, bounds.max_prompt_bytes) == (81, 8191 * 81)
    assert len(tokenizer.encode("\n" + " " * 80)) == 1


class CountingTokenizer:
    """The tiny tokenizer, counting the texts it is asked to encode."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.encoded: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def encode(self, text: str) -> list[int]:
        self.encoded.append(len(text))
        return self.inner.encode(text)


def test_a_prompt_over_the_bound_is_refused_without_tokenizing(tiny_model: Model) -> None:
    tok = CountingTokenizer(tiny_model.tokenizer)
    noted: list[bool] = []

    async def attempt(inp: GenerateInput) -> None:
        gate = WorkGate(on_large=lambda: noted.append(True))
        jobs = JobBuilder(tok, tiny_model.config, 60.0, gate)  # type: ignore[arg-type]
        try:
            await jobs.build(inp, "t", None)
        finally:
            gate.close()

    limit = InputBounds.of(tiny_model.tokenizer, tiny_model.config).max_prompt_bytes
    with pytest.raises(PromptTooLargeError):
        asyncio.run(attempt(GenerateInput(prompt="x" * (limit + 1))))
    messages = [{"role": "user", "content": "x" * limit}, {"role": "user", "content": "y"}]
    with pytest.raises(PromptTooLargeError):
        asyncio.run(attempt(GenerateInput(messages=messages)))
    assert tok.encoded == [] and noted == [True, True]  # a heap trim follows each
    with pytest.raises(PromptTooLongError):  # within the bound: tokenized, then too long
        asyncio.run(attempt(GenerateInput(prompt="x" * limit)))
    assert tok.encoded == [limit]
