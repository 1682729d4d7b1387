"""SIGINT and SIGTERM for a supervisor: the first asks for a clean stop, the second for one now."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

HANDLED = (signal.SIGINT, signal.SIGTERM)


class StopRequested(BaseException):
    """The first stop signal arrived inside `StopSignals.interruptible()`."""


class StopNow(BaseException):
    """The second stop signal: stop without waiting for anything to drain."""


class StopSignals:
    """Counts SIGINT/SIGTERM. The handler only sets a counter or raises, so it takes no lock.

    Use from the main thread: `install()`, poll `requested`, and `restore()` in `finally`.
    """

    def __init__(self) -> None:
        self.count = 0
        self._interruptible = False
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """True once a stop signal has arrived."""
        return self.count > 0

    @property
    def urgent(self) -> bool:
        """True once a second stop signal has arrived."""
        return self.count > 1

    def install(self) -> StopSignals:
        for signum in HANDLED:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """Inside, the first signal raises StopRequested, so a long blocking start can be left."""
        if self.requested:
            raise StopRequested
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1 and self._interruptible:
            raise StopRequested
        if self.count == 2:
            raise StopNow
