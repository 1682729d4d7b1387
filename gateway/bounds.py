"""How much a request may hold before the gateway does anything expensive with it. No token
spans more bytes than the vocabulary's longest one, so a text of more bytes than
(context_length - 1) times that length has more tokens than the context holds: it is refused
from its size alone, without tokenizing it (the chat template only adds to the text)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from common.errors import PromptTooLargeError, PromptTooLongError
from engine.text.model_config import ModelConfig
from engine.text.tokenizer import Tokenizer

# What a Generate request carries besides its text: a chat message's framing (tags, lengths,
# role) each, and the rest (stop strings, session id, sampling fields) in all.
MESSAGE_FRAMING_BYTES = 32
OTHER_FIELDS_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class InputBounds:
    context_length: int
    max_token_bytes: int  # the vocabulary's longest token, in bytes

    @classmethod
    def of(cls, tokenizer: Tokenizer, config: ModelConfig) -> InputBounds:
        longest = max(len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size))
        return cls(config.context_length, max(1, longest))

    @property
    def max_tokens_in(self) -> int:
        """Prompt tokens that fit: one position is kept for the first generated token."""
        return self.context_length - 1

    @property
    def max_prompt_bytes(self) -> int:
        """The most bytes of text (a prompt, or the messages' contents together) that can
        still fit the context."""
        return self.max_tokens_in * self.max_token_bytes

    @property
    def max_request_bytes(self) -> int:
        """The largest encoded Generate request that can hold a prompt that fits."""
        return (self.max_prompt_bytes + self.context_length * MESSAGE_FRAMING_BYTES
                + OTHER_FIELDS_BYTES)  # fmt: skip

    def check_text(self, field: str, texts: Iterable[str]) -> int:
        """The texts' UTF-8 bytes together; PromptTooLargeError once they cannot fit. Costs
        no copy for ASCII text, and reads at most the limit's worth of characters."""
        total = 0
        for text in texts:
            total += utf8_size(text, self.max_prompt_bytes - total + 1)
            if total > self.max_prompt_bytes:
                raise PromptTooLargeError(field, f"{self._over(total)} {self._why()}")
        return total

    def check_count(self, field: str, count: int) -> None:
        """`count` messages or token ids: each is one token of the prompt at least."""
        if count <= self.max_tokens_in:
            return
        if field == "token_ids":
            raise PromptTooLongError(count, self.context_length)
        context = self.context_length
        raise PromptTooLargeError(
            field, f"{count} {field} cannot fit the context of {context} tokens (each takes one)"
        )

    def check_request(self, num_bytes: int) -> str | None:
        """Why an encoded Generate request of `num_bytes` is refused unread, or None."""
        if num_bytes <= self.max_request_bytes:
            return None
        return (f"the request has {num_bytes} bytes, more than one whose text fits a context of "
                f"{self.context_length} tokens can have ({self.max_request_bytes}): "
                f"{self._why()}")  # fmt: skip

    def _over(self, num_bytes: int) -> str:
        context = self.context_length
        return f"{num_bytes} bytes of text or more cannot fit a context of {context} tokens:"

    def _why(self) -> str:
        tokens, longest = self.max_tokens_in, self.max_token_bytes
        return (f"at most {self.max_prompt_bytes} bytes can ({tokens} tokens of at most "
                f"{longest} bytes, the vocabulary's longest token)")  # fmt: skip


def utf8_size(text: str, limit: int) -> int:
    """The UTF-8 size of `text`, or some number over `limit` once it is over."""
    if len(text) > limit or text.isascii():
        return len(text)  # every character is one byte at least
    return len(text.encode("utf-8", "surrogatepass"))
