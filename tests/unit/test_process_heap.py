"""engine/thread_env.py's heap setting: a step's megabyte arrays come back from the heap
instead of fresh pages, counted as the page faults a process takes (each in a fresh
interpreter, as a worker starts)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

# 20 rounds of a layer's product outputs (4 of 512 x 1536 float32, 3 MiB each): written, then
# freed
FAULTS = """
import resource, sys
from engine.thread_env import keep_freed_arrays
kept = keep_freed_arrays() if sys.argv[1] == "kept" else False
import numpy as np
def rounds(n):
    for _ in range(n):
        outputs = [np.empty((512, 1536), np.float32) for _ in range(4)]
        for a in outputs:
            a.fill(1.0)
        del outputs, a
rounds(2)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds(20)
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str, env: dict[str, str] | None = None) -> tuple[bool, int]:
    command = [sys.executable, "-c", FAULTS, mode]
    environment = {**os.environ, **(env or {})}
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, env=environment)
    assert run.returncode == 0, run.stderr
    kept, count = run.stdout.split()
    return kept == "True", int(count)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_freed_arrays_are_reused_not_faulted_again() -> None:
    kept, reused = faults("kept")
    assert kept
    assert reused <= 2  # the same heap memory each round
    _, fresh = faults("default")
    assert fresh >= 20  # glibc's default gives them back: a fault at least a round


def test_the_environment_wins() -> None:
    kept, _ = faults("kept", {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"})
    assert not kept
