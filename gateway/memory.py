"""The gateway's heap after a large request. Two allocators keep what a burst of large input
freed: glibc keeps freed memory in its arenas, one per thread that allocated, and gives back
only what lies at a heap's top; Python's own (pymalloc) keeps every 1 MiB arena of small
objects in which any object still lives, and a large body or a long prompt's token ids are
hundreds of thousands of small objects, among which the gateway's own objects settle.

`tune_malloc` (at start, before any thread) keeps glibc to one arena and has the gateway's
objects allocated by glibc's malloc instead of pymalloc (PYTHONMALLOC=malloc: the process
starts itself again with it). One arena because malloc_trim gives back the free pages of a
thread's arena but never the free memory at its top, which glibc keeps while it is under
its trim threshold, and that threshold grows with the largest block freed (up to 64 MiB):
with two arenas, a thread that tokenized 600 KB prompts kept ~46 MB there, in processes
where that thread happened to get the second arena. `HeapTrimmer` runs malloc_trim for a
few seconds after large input, which gives back the free pages inside the heap too, small
objects' included, and every TRIM_ANYWAY_S in any case (what a busy box frees after those
few seconds; a trim that finds nothing to give back takes about 0.1 ms).
glibc's own thresholds stay (mapping each large block on its own, or keeping large blocks in
the heap for reuse, were both tried: the first makes refusals slower, page faults on every
large message; the second keeps memory that malloc_trim then does not give back). All of it
is a no-op off glibc.

Before a trim, a full collection: a refused request's input can hang on in a reference cycle
through its error's traceback, and under load that cycle reaches the oldest generation,
which Python collects rarely. `freeze_startup` keeps that collection cheap. Large HTTP bodies
are noted as they arrive (`NoteLargeBodies`), refused ones included: their parsed JSON never
reaches the tokenizing threads, which note the others."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import os
import sys
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.work_gate import LARGE_BYTES

M_ARENA_MAX = -8  # mallopt's parameter (malloc.h)
MALLOC_ARENAS = 1  # malloc_trim gives back all of it (bench/RESULTS.md: no slower to tokenize)
TRIM_EVERY_S = 1.0
SYSTEM_MALLOC = "malloc"  # PYTHONMALLOC's value for glibc's malloc
TRIMS_AFTER_LARGE = 3  # trims after the last large input (its objects may outlive the first)
MORE_TRIMS_AT_MOST = 30  # then one more while the last gave back GAVE_BACK_BYTES (a busy box)
GAVE_BACK_BYTES = 1 << 20
TRIM_ANYWAY_S = 10.0


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
    """Bound the arenas and allocate objects with malloc; False off glibc. Without
    PYTHONMALLOC in the environment the process is started again (exec: the same pid,
    arguments and environment) with PYTHONMALLOC=malloc, so call it first thing.
    PYTHONMALLOC and MALLOC_ARENA_MAX in the environment win (glibc reads the second
    itself)."""
    libc = _libc()
    if libc is None:
        return False
    if "PYTHONMALLOC" not in os.environ:  # read only when the interpreter starts
        os.environ["PYTHONMALLOC"] = SYSTEM_MALLOC
        os.execv(sys.executable, sys.orig_argv)
    if "MALLOC_ARENA_MAX" not in os.environ:
        libc.mallopt(M_ARENA_MAX, MALLOC_ARENAS)
    return True


def trim_heap() -> None:
    """Give the heaps' free pages back to the system (glibc; a no-op elsewhere)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def rss_bytes() -> int:
    """This process's resident memory (Linux; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def freeze_startup() -> None:
    """Once the gateway serves: collect, leave what is left (modules, the tokenizer, the
    servers) out of every later collection, so that a full one walks only what requests
    made, not the whole gateway; and give back what starting freed."""
    gc.collect()
    gc.freeze()
    trim_heap()


class HeapTrimmer:
    """Trims the heap once a second for a few seconds after `noted` large inputs, and on
    while each trim still gives memory back, and every TRIM_ANYWAY_S whatever came; off the
    event loop (a trim walks every arena)."""

    def __init__(self) -> None:
        self._trims_left = 0
        self._more_left = 0
        self._task: asyncio.Task[None] | None = None

    def note(self) -> None:
        self._trims_left = TRIMS_AFTER_LARGE
        self._more_left = MORE_TRIMS_AT_MOST

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last_trim = loop.time()
        while True:
            await asyncio.sleep(TRIM_EVERY_S)
            noted = self._trims_left > 0
            if not noted and loop.time() - last_trim < TRIM_ANYWAY_S:
                continue
            self._trims_left -= noted
            # the oldest generation too: a refused input's cycle may have reached it
            gc.collect()
            before = rss_bytes()
            await asyncio.to_thread(trim_heap)
            last_trim = loop.time()
            # on a busy box a large input's objects may go later than the first trims
            if noted and not self._trims_left and self._more_left > 0:
                self._more_left -= 1
                self._trims_left = int(before - rss_bytes() >= GAVE_BACK_BYTES)


class NoteLargeBodies:
    """ASGI middleware: an HTTP request whose body reaches LARGE_BYTES calls `note` (the
    trimmer's) as the body arrives and once more as the request ends."""

    def __init__(self, app: ASGIApp, note: Callable[[], None]) -> None:
        self.app = app
        self.note = note

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        num_bytes = 0

        async def counted() -> Message:
            nonlocal num_bytes
            message = await receive()
            if num_bytes < LARGE_BYTES and message["type"] == "http.request":
                num_bytes += len(message.get("body", b""))
                if num_bytes >= LARGE_BYTES:
                    self.note()
            return message

        try:
            await self.app(scope, counted, send)
        finally:
            if num_bytes >= LARGE_BYTES:  # again: a served request holds its body until its end
                self.note()
