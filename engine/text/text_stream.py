"""A sequence's text as it grows: complete UTF-8 only, and never a piece of a stop string."""

from __future__ import annotations

from engine.text.detokenizer import StreamDecoder


class TextStream:
    """Turns new token ids into text to emit, holding back a tail that could begin a stop
    string, and reports when a stop string appears (the text before it is all that is sent)."""

    __slots__ = ("_decoder", "_hold", "_pending", "_stop", "matched")

    def __init__(self, decoder: StreamDecoder, stop: tuple[str, ...] = ()) -> None:
        self._decoder = decoder
        self._stop = stop
        self.matched = ""  # the stop string that ended the text, once one has
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._pending = ""

    def push(self, token_id: int) -> tuple[str, bool]:
        """Text that is now safe to emit, and whether a stop string was reached."""
        self._pending += self._decoder.push(token_id)
        return self._release()

    def finish(self) -> tuple[str, bool]:
        """Everything still held (the sequence ended for another reason)."""
        self._pending += self._decoder.flush()
        text, stopped = self._release()
        if not stopped:
            text, self._pending = text + self._pending, ""
        return text, stopped

    def _release(self) -> tuple[str, bool]:
        hits = [(i, s) for s in self._stop if (i := self._pending.find(s)) >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda hit: hit[0])
            text, self._pending = self._pending[:at], ""
            return text, True
        cut = len(self._pending) - self._hold
        if cut <= 0:
            return "", False
        text, self._pending = self._pending[:cut], self._pending[cut:]
        return text, False
