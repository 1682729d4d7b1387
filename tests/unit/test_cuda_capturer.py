"""CudaCapturer's use of CuPy (engine/decode_graphs.py), against a stand-in for CuPy's
stream, memory pool and graph objects that writes down each call: the step runs once
eagerly after the inputs' stream and inside the graph's own pool before it is captured in
that pool too, and a replay is ordered after the caller's work and before what follows.
The real capture runs in bench/gpu_check.sh (test_decode_graphs.py's CUDA case)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from engine.decode_graphs import CudaCapturer


class FakeCuPy:
    """The few CuPy calls CudaCapturer makes, each one written to `calls`."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.caller = self.stream("caller")
        self.current = self.caller
        self.allocator = "default"
        self.cuda = SimpleNamespace(
            Stream=lambda non_blocking: self.stream("graphs"),
            MemoryPool=lambda: SimpleNamespace(malloc=f"pool{len(self.calls)}"),
            using_allocator=self.using_allocator,
            get_current_stream=lambda: self.current,
        )

    def stream(self, name: str) -> Any:
        fake = self

        class Stream:
            capturing = False

            def __enter__(self) -> None:
                self.before, fake.current = fake.current, self

            def __exit__(self, *exc: object) -> None:
                fake.current = self.before

            def record(self) -> str:
                fake.calls.append(f"{name} records")
                return name

            def wait_event(self, event: str) -> None:
                fake.calls.append(f"{name} waits for {event}")

            def synchronize(self) -> None:
                fake.calls.append(f"{name} synchronizes")

            def begin_capture(self) -> None:
                self.capturing = True
                fake.calls.append(f"{name} begins a capture")

            def end_capture(self) -> Any:
                self.capturing = False
                fake.calls.append(f"{name} ends the capture")
                return SimpleNamespace(
                    upload=lambda s: fake.calls.append("graph uploaded"),
                    launch=lambda s: fake.calls.append(f"graph launched on {s is self}"),
                )

        return Stream()

    @contextlib.contextmanager
    def using_allocator(self, malloc: str) -> Iterator[None]:
        before, self.allocator = self.allocator, malloc
        yield
        self.allocator = before


def test_the_step_runs_once_in_the_graphs_pool_then_is_captured_and_replays_in_order() -> None:
    cp = FakeCuPy()
    capturer = CudaCapturer(cp)

    def run() -> None:
        mode = "captured" if cp.current.capturing else "eager"
        cp.calls.append(f"step {mode} on {cp.current is capturer.stream} with {cp.allocator}")

    replay = capturer.capture(run)
    pool = capturer.pools[0].malloc
    assert cp.calls == [
        "caller records",
        "graphs waits for caller",
        f"step eager on True with {pool}",
        "graphs synchronizes",
        "graphs begins a capture",
        f"step captured on True with {pool}",
        "graphs ends the capture",
        "graph uploaded",
    ]
    assert cp.current is cp.caller and cp.allocator == "default"  # both restored
    cp.calls.clear()
    replay()
    assert cp.calls == [
        "caller records",
        "graphs waits for caller",
        "graph launched on True",
        "graphs records",
        "caller waits for graphs",
    ]
