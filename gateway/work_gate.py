"""The gateway's expensive steps (tokenizing a prompt, parsing a large body) run off the event
loop on a few threads of their own, at most `max_running` at once. Inputs waiting for one hold
memory, so their bytes together are bounded: past `max_waiting_bytes` a request is refused at
once with QueueFullError (RESOURCE_EXHAUSTED, HTTP 429) and a retry hint. A small input is
never refused while nothing waits, and small ones barely count against the bound."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from common.errors import QueueFullError

T = TypeVar("T")
MAX_RUNNING = 2  # threads; tokenizing holds a core each
MAX_WAITING_BYTES = 16 << 20
BYTES_PER_S = 1 << 20  # what one thread tokenizes, about (it sets the retry hint only)
LARGE_BYTES = 64 << 10  # an input from this size on is worth a heap trim afterwards


class WorkGate:
    def __init__(
        self,
        max_running: int = MAX_RUNNING,
        max_waiting_bytes: int = MAX_WAITING_BYTES,
        on_large: Callable[[], None] = lambda: None,
    ) -> None:
        self.max_running = max_running
        self.max_waiting_bytes = max_waiting_bytes
        self.on_large = on_large  # called after each large input's work (a heap trim)
        self._slots = asyncio.Semaphore(max_running)
        self._pool = ThreadPoolExecutor(max_running, thread_name_prefix="tokenize")
        self.num_waiting = 0
        self.waiting_bytes = 0
        self.num_refused = 0

    async def run(self, size: int, fn: Callable[..., T], *args: object) -> T:
        """fn(*args) on one of the gate's threads, `size` being its input's bytes; raises
        QueueFullError when too many bytes wait already."""
        if self.num_waiting and self.waiting_bytes + size > self.max_waiting_bytes:
            self.num_refused += 1
            retry_ms = self.retry_after_ms()
            raise QueueFullError(
                f"too much input waits to be tokenized ({self.num_waiting} requests, "
                f"{self.waiting_bytes} bytes; the gateway holds at most "
                f"{self.max_waiting_bytes}); retry after {retry_ms} ms", retry_ms
            )  # fmt: skip
        self.num_waiting += 1
        self.waiting_bytes += size
        try:
            await self._slots.acquire()
        finally:
            self.num_waiting -= 1
            self.waiting_bytes -= size
        loop = asyncio.get_running_loop()
        try:
            work = self._pool.submit(fn, *args)
        except BaseException:
            self._slots.release()
            raise
        # the slot frees when the work ends, not when a caller that went away stops waiting
        work.add_done_callback(lambda _: _call_soon(loop, self._ended, size))
        try:
            return await asyncio.wrap_future(work)
        finally:  # the future holds fn's error, whose traceback holds this frame: a cycle
            del work  # that kept a refused prompt's input alive until a full collection

    def _ended(self, size: int) -> None:
        self._slots.release()
        if size >= LARGE_BYTES:
            self.on_large()

    def retry_after_ms(self) -> int:
        """About how long the waiting input takes, 1-60 s."""
        seconds = self.waiting_bytes / (BYTES_PER_S * self.max_running)
        return min(60_000, 1000 * max(1, math.ceil(seconds)))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: the gateway has stopped
        loop.call_soon_threadsafe(fn, *args)
