"""Turn a stream of token ids into text, one token at a time."""

from __future__ import annotations

import codecs
from typing import Protocol


class TokenSource(Protocol):
    def token_bytes(self, token_id: int) -> bytes: ...

    def is_special(self, token_id: int) -> bool: ...


class StreamDecoder:
    """Incremental decode of one sequence: each push() costs O(bytes of that token).

    The concatenation of every push() and the final flush() equals
    `tokenizer.decode(ids, skip_special=skip_special)`.
    """

    def __init__(self, tokenizer: TokenSource, skip_special: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        # Holds back at most the 1-3 bytes of a UTF-8 sequence that is still incomplete; bytes
        # that no continuation can make valid become U+FFFD at once, as decode() makes them.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text that `token_id` completes; "" while a multi-byte character is still partial."""
        if self._skip_special and self._tokenizer.is_special(token_id):
            return ""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """What is left at the end of the stream; an unfinished character becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)
