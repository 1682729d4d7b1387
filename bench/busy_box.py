"""Decode steps on a box another process keeps busy (an agent's build, a test run): a batch's
steps timed alone and beside one process spinning on a core, with the worker's kernels on
every core and on one fewer. In one process, alternated each round.

    .venv/bin/python -m bench.busy_box [--model PATH] [--kv-dtype float16]
        [--batches 1 8] [--steps 30] [--rounds 3]

The kernels open a parallel region an operation (a step's ~200 with the default model), and
each waits at its end for every thread of its team: one the OS has put off the core for the
other process holds the step until it runs again.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from bench.restore_readers import decoding, timed_steps
from bench.table import print_table
from engine.device import set_threads
from engine.model import Model
from warmfleet.models import resolve_model

SPIN = "while True: pass"
START_S = 0.2  # for the spinning process to be running


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a GGUF file (default: the default model)")
    parser.add_argument("--kv-dtype", default="float16", choices=("float32", "float16", "q8_0"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--steps", type=int, default=30, help="decode steps timed a case")
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    model = Model.load(resolve_model(args.model), kv_dtype=args.kv_dtype)
    cores = os.cpu_count() or 1
    counts = sorted({cores, max(1, cores - 1)}, reverse=True)
    times: dict[tuple[int, int, bool], list[float]] = {}
    for batch in args.batches:
        engine = decoding(model, batch)
        timed_steps(engine, 5)  # warm
        for _ in range(args.rounds):
            for threads in counts:
                set_threads(threads)
                times.setdefault((batch, threads, False), []).extend(
                    timed_steps(engine, args.steps)
                )
                spin = subprocess.Popen([sys.executable, "-c", SPIN])
                try:
                    time.sleep(START_S)
                    times.setdefault((batch, threads, True), []).extend(
                        timed_steps(engine, args.steps)
                    )
                finally:
                    spin.kill()
                    spin.wait(timeout=10)
    set_threads(cores)
    print(f"\nDecode steps (ms, median / 90th percentile), KV {args.kv_dtype}, {cores} cores")
    rows = []
    for (batch, threads, busy), t in sorted(times.items()):
        ms = sorted(x * 1e3 for x in t)
        p90 = ms[int(0.9 * (len(ms) - 1))]
        beside = "one spinning process" if busy else "nothing"
        rows.append(
            (str(batch), str(threads), beside, f"{statistics.median(ms):.1f}", f"{p90:.1f}")
        )
    print_table(("batch", "kernel threads", "beside", "step (ms)", "p90 (ms)"), rows)


if __name__ == "__main__":
    main()
