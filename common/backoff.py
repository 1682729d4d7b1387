"""Exponential back-off with a cap, for service loops that reconnect."""

from __future__ import annotations


class Backoff:
    def __init__(self, first_s: float = 0.1, cap_s: float = 2.0) -> None:
        self.first_s = first_s
        self.cap_s = cap_s
        self._next = first_s

    def reset(self) -> None:
        """After a success: the next failure waits `first_s` again."""
        self._next = self.first_s

    def next_s(self) -> float:
        """How long to wait after this failure (doubling up to the cap)."""
        delay = self._next
        self._next = min(self._next * 2, self.cap_s)
        return delay
