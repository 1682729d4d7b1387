"""HeapTrimmer's schedule: a few trims after each noted large input, and one every
TRIM_ANYWAY_S whatever came (memory a busy box frees after those few trims still goes back).
The trim itself is counted, not run: the gateway memory test runs the real one."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from gateway import memory


@pytest.fixture
def trims(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    seen: list[float] = []
    monkeypatch.setattr(memory, "TRIM_EVERY_S", 0.01)
    monkeypatch.setattr(memory, "trim_heap", lambda: seen.append(time.monotonic()))
    monkeypatch.setattr(memory, "rss_bytes", lambda: 0)  # so no trim "gave back" memory
    return seen


async def _run_until(
    trimmer: memory.HeapTrimmer, trims: list[float], count: int, then_s: float = 0.0
) -> None:
    """Run the trimmer until `count` trims, then `then_s` more."""
    trimmer.start()
    try:
        deadline = time.monotonic() + 10
        while len(trims) < count:
            assert time.monotonic() < deadline, f"{len(trims)} trims, waited for {count}"
            await asyncio.sleep(0.01)
        await asyncio.sleep(then_s)
    finally:
        await trimmer.stop()


def test_a_noted_input_gets_its_trims_then_no_more_until_the_anyway_one(
    trims: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "TRIM_ANYWAY_S", 3600.0)
    trimmer = memory.HeapTrimmer()
    trimmer.note()
    asyncio.run(_run_until(trimmer, trims, memory.TRIMS_AFTER_LARGE, then_s=0.2))
    assert len(trims) == memory.TRIMS_AFTER_LARGE


def test_the_heap_is_trimmed_anyway_without_any_input(
    trims: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "TRIM_ANYWAY_S", 0.05)
    trimmer = memory.HeapTrimmer()
    asyncio.run(_run_until(trimmer, trims, 3))
    gaps = [b - a for a, b in itertools.pairwise(trims)]
    assert all(gap >= 0.05 for gap in gaps), gaps
