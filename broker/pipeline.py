"""A Redis pipeline whose results are read by the name of the section that queued them,
not by position (sections come and go with what a round trip carries)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis


class Sections:
    def __init__(self, r: redis.Redis) -> None:
        self.pipe = r.pipeline(transaction=False)
        self._spans: dict[str, tuple[int, int]] = {}
        self._results: list[Any] = []

    @contextmanager
    def section(self, name: str) -> Iterator[redis.client.Pipeline]:
        """Queue a section's commands on the pipeline this yields."""
        start = len(self.pipe)
        yield self.pipe
        self._spans[name] = (start, len(self.pipe))

    def execute(self, *, raise_on_error: bool = True) -> Sections:
        if len(self.pipe):
            self._results = self.pipe.execute(raise_on_error=raise_on_error)
        return self

    def results(self, name: str) -> list[Any]:
        """The replies of a section, in the order it queued them ([] if it was not queued)."""
        start, stop = self._spans.get(name, (0, 0))
        return self._results[start:stop]
