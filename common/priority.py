"""A thread's CPU priority lowered (Linux: a thread has a nice value of its own), for the
threads whose work should wait for the decoding threads: the worker's spill writes and its
block reads."""

from __future__ import annotations

import contextlib
import os
import threading

MAX_NICE = 19


def lower_thread_priority(by: int) -> None:
    """Add `by` to the calling thread's nice value (at most MAX_NICE). Where threads have no
    priority of their own (macOS) or it cannot be read, the process's is kept."""
    with contextlib.suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        os.setpriority(
            os.PRIO_PROCESS, tid, min(MAX_NICE, os.getpriority(os.PRIO_PROCESS, tid) + by)
        )
