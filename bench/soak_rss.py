"""Resident memory of every part, sampled from /proc/PID/status while the soak runs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from warmfleet.processes import Process

_KIB_PER_MIB = 1024


def rss_kib(pid: int) -> int | None:
    """VmRSS of a process in KiB; None if it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


@dataclass
class RssLog:
    """Samples by part: (when, pid, KiB)."""

    samples: dict[str, list[tuple[float, int, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def sample(self, processes: dict[str, Process]) -> None:
        now = time.monotonic()
        for name, process in processes.items():
            if (kib := rss_kib(process.pid)) is not None:
                self.samples[name].append((now, process.pid, kib))

    async def run(
        self, processes: Callable[[], dict[str, Process]], every_s: float, stop: asyncio.Event
    ) -> None:
        """Sample every `every_s` until `stop`."""
        while not stop.is_set():
            self.sample(processes())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)

    def rows(self) -> list[list[str]]:
        """Per part: pids, start, peak and end in MiB, end minus start, samples."""
        rows = []
        for name, samples in sorted(self.samples.items(), key=lambda kv: _order(kv[0])):
            kib = [s[2] for s in samples]
            pids = sorted({s[1] for s in samples}, key=[s[1] for s in samples].index)
            rows.append([
                name, ", ".join(map(str, pids)), _mib(kib[0]), _mib(max(kib)), _mib(kib[-1]),
                f"{(kib[-1] - kib[0]) / _KIB_PER_MIB:+.1f}", str(len(kib)),
            ])  # fmt: skip
        return rows


RSS_HEADER = ["process", "pid", "start (MiB)", "peak (MiB)", "end (MiB)", "end - start (MiB)",
              "samples"]  # fmt: skip


def _mib(kib: int) -> str:
    return f"{kib / _KIB_PER_MIB:.1f}"


def _order(name: str) -> tuple[int, str]:
    return (["gateway", "kvstore", "redis"].index(name) if name in ("gateway", "kvstore",
            "redis") else 3, name)  # fmt: skip
