"""CUDA graphs on the CPU stand-in (cupy_module.py). While a stream captures, every operation
on device arrays (a kernel launch, a CuPy function or operator, a method, a write into an
array) runs and is recorded as a step that computes it again into the memory it wrote; a
graph's launch runs those steps in order. That is what a CUDA graph replays: the captured
launches, their arguments' addresses and the Python values of the capture fixed, the
memory's contents as they are at the launch.

As on a GPU, a capture refuses what would invalidate it: a read back to the host (`.get()`,
`int()`, `float()`, `bool()`, `.item()` of a device array) and a copy of host memory to
the device (`cupy.asarray` of a NumPy array, a NumPy array written into a device one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Step = Callable[[], None]
_tape: list[Step] | None = None  # the steps of the capture under way


def abandon_capture() -> None:
    global _tape
    _tape = None


def refuse_in_capture(what: str) -> None:
    if _tape is not None:
        raise RuntimeError(f"{what} during a CUDA graph capture (the capture would be invalidated)")


def traced(call: Callable[[], Any]) -> Any:
    """call()'s result (NumPy scalars as 0-d arrays, as CuPy's are), recorded where a capture
    is under way: replayed, it computes again into the same arrays."""
    result = _arrays(call())
    if _tape is not None:
        _tape.append(lambda: _copy_into(result, _arrays(call())))
    return result


def _arrays(value: Any) -> Any:
    if isinstance(value, np.generic):
        return np.asarray(value)
    if isinstance(value, tuple):
        return tuple(_arrays(v) for v in value)
    return value


def _copy_into(target: Any, fresh: Any) -> None:
    if isinstance(target, tuple):
        for t, f in zip(target, fresh, strict=True):
            _copy_into(t, f)
    elif isinstance(target, np.ndarray) and target is not fresh and target.flags.writeable:
        np.copyto(target, fresh, casting="unsafe")


class Graph:
    def __init__(self, steps: list[Step]) -> None:
        self.steps = steps

    def upload(self, stream: Any = None) -> None:
        pass

    def launch(self, stream: Any = None) -> None:
        if _tape is not None:
            raise RuntimeError("a graph launched during a capture (not emulated)")
        for step in self.steps:
            step()


class Event:
    def synchronize(self) -> None:
        pass


class Stream:
    """A stream: work runs at once (the stand-in has one order); capture as above."""

    def __init__(self, non_blocking: bool = False) -> None:
        self.non_blocking = non_blocking

    def synchronize(self) -> None:
        refuse_in_capture("a stream synchronized")

    def record(self, event: Event | None = None) -> Event:
        return event or Event()

    def wait_event(self, event: Event) -> None:
        pass

    def begin_capture(self) -> None:
        global _tape
        if _tape is not None:
            raise RuntimeError("a capture begun within a capture")
        _tape = []

    def end_capture(self) -> Graph:
        global _tape
        if _tape is None:
            raise RuntimeError("end_capture without begin_capture")
        steps, _tape = _tape, None
        return Graph(steps)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
