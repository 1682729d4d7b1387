"""Run a benchmark's measuring half in a process of its own under environment settings that
are read once a process (WARMFLEET_CHUNK_ROWS and the like), and read back what it printed
last: one line of JSON. The benchmarks that compare such settings alternate these runs, so
that their ratios are taken in one run of the benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

RUN_TIMEOUT_S = 1800.0  # one measuring process; a slow machine's whole workload fits


def measured(module: str, args: list[str], settings: dict[str, str]) -> Any:
    """`python -m module *args` with `settings` added to the environment; its last line of
    stdout, parsed as JSON. Its stderr (progress) passes through; a failure raises."""
    env = {**os.environ, **settings}
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=True,
    )
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{module} {' '.join(args)} printed nothing")
    return json.loads(lines[-1])
