"""The gateway's heap after a large request: glibc keeps freed memory in its arenas, one per
thread that allocated, and gives back only what lies at a heap's top. Without care a burst of
multi-megabyte prompts leaves the gateway hundreds of MB larger for good (issue 17; measured
here: +133 MB after three rounds of 20 prompts of 5 MB and 20 chats of 900 KB).

`tune_malloc` (at start, before any thread) keeps to MALLOC_ARENAS arenas; `HeapTrimmer`
runs malloc_trim for a few seconds after large input, which gives back the free pages inside
the heaps too. glibc's own thresholds stay (mapping each large block on its own, or keeping
large blocks in the heap for reuse, were both tried: the first makes refusals slower, page
faults on every large message; the second keeps memory that malloc_trim then does not give
back). Both are no-ops off glibc."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import os

M_ARENA_MAX = -8  # mallopt's parameter (malloc.h)
MALLOC_ARENAS = 2  # the event loop's and one for every other thread together
TRIM_EVERY_S = 1.0
TRIMS_AFTER_LARGE = 3  # trims after the last large input (its objects may outlive the first)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt  # noqa: B018  # glibc's, absent from musl and macOS
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def tune_malloc() -> bool:
    """Bound the arenas; False off glibc. MALLOC_ARENA_MAX in the environment wins (glibc
    reads it itself)."""
    libc = _libc()
    if libc is None:
        return False
    if "MALLOC_ARENA_MAX" not in os.environ:
        libc.mallopt(M_ARENA_MAX, MALLOC_ARENAS)
    return True


def trim_heap() -> None:
    """Give the heaps' free pages back to the system (glibc; a no-op elsewhere)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


class HeapTrimmer:
    """Trims the heap once a second for a few seconds after `noted` large inputs, off the
    event loop (a trim walks every arena)."""

    def __init__(self) -> None:
        self._trims_left = 0
        self._task: asyncio.Task[None] | None = None

    def note(self) -> None:
        self._trims_left = TRIMS_AFTER_LARGE

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TRIM_EVERY_S)
            if self._trims_left > 0:
                self._trims_left -= 1
                # a refused request's text can hang on in a cycle (its error's traceback):
                # the young generations' collection frees it, in well under a millisecond
                gc.collect(1)
                await asyncio.to_thread(trim_heap)
