"""A prefill chunk in the C kernels against BLAS on this build: the step that computes a
chunk of N new tokens after P cached positions, timed both ways, and the ratio. The bound
engine/ops/chunks.py sets for a build (how long a chunk stays in the kernels) comes from it.

    .venv/bin/python -m bench.chunk_paths [--rows 48 64 96 128 192 256 512]
        [--positions 600] [--repeats 3] [--model PATH]

Each way runs in a process of its own, alternated --repeats times: WARMFLEET_CHUNK_ROWS=all
(every chunk in the kernels) and =32 (chunks past 32 rows to BLAS: their products against
the weights expanded to float32, their attention over gathered keys). One Engine with every
core, float16 KV. Build the kernels for AVX2 on an AVX-512 machine with
`WARMFLEET_MARCH=haswell OPENBLAS_CORETYPE=Haswell`. Figures are the best of the repeats;
progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from bench.settings_run import measured
from bench.table import print_table
from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine import Engine
from engine.model import Model
from engine.ops.chunks import CHUNK_ROWS_ENV, SMALL_ROWS
from engine.ops.native import isa
from engine.sequence import Request
from warmfleet.models import resolve_model

WAYS = {"kernels": "all", "BLAS": str(SMALL_ROWS)}


def chunk_ms(engine: Engine, base: list[int], rows: int, key: str) -> float:
    """The step that prefills `rows` new tokens after the session's `base`, in ms."""
    engine.generate([Request(key + "a", base, SamplingParams(max_tokens=1), cache_key=key)])
    rng = np.random.default_rng(rows)
    extra = [int(t) for t in rng.integers(100, 40_000, rows)]
    engine.add(Request(key + "b", base + extra, SamplingParams(max_tokens=1), cache_key=key))
    start = time.perf_counter()
    engine.step()
    took = time.perf_counter() - start
    while engine.has_work:
        engine.step()
    return took * 1e3


def measure(args: argparse.Namespace) -> None:
    """One way (this process's WARMFLEET_CHUNK_ROWS): each chunk once, as JSON."""
    model = Model.load(resolve_model(args.model), kv_dtype="float16")
    longest = max(args.rows)
    engine = Engine(model, EngineConfig(prefill_chunk_tokens=longest, step_prefill_tokens=longest))
    engine.warm_up()
    rng = np.random.default_rng(0)
    base = [int(t) for t in rng.integers(100, 40_000, args.positions)]
    times = {rows: chunk_ms(engine, base, rows, f"c{rows}") for rows in args.rows}
    print(json.dumps(times))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[48, 64, 96, 128, 192, 256, 512])
    p.add_argument("--positions", type=int, default=600, help="cached positions before the chunk")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", help="a GGUF file (default: the default model)")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        return measure(args)
    forwarded = ["--measure", "--positions", str(args.positions), "--rows", *map(str, args.rows)]
    forwarded += ["--model", args.model] if args.model else []
    best: dict[str, dict[int, float]] = {way: {} for way in WAYS}
    for repeat in range(args.repeats):
        for way, setting in WAYS.items():
            print(f"repeat {repeat + 1}: {way}", file=sys.stderr)
            got = measured("bench.chunk_paths", forwarded, {CHUNK_ROWS_ENV: setting})
            for rows, ms in got.items():
                best[way][int(rows)] = min(ms, best[way].get(int(rows), ms))
    print(f"One chunk after {args.positions} cached positions, kernels built for {isa()}")
    print(f"best of {args.repeats}, each way in a process of its own, alternated")
    header = [
        "rows",
        "kernels (ms)",
        "BLAS (ms)",
        "kernels ms/row",
        "BLAS ms/row",
        "kernels / BLAS",
    ]
    print_table(
        header, [row(rows, best["kernels"][rows], best["BLAS"][rows]) for rows in args.rows]
    )


def row(rows: int, kernels_ms: float, blas_ms: float) -> list[str]:
    per_row = [f"{kernels_ms / rows:.2f}", f"{blas_ms / rows:.2f}"]
    return [
        str(rows),
        f"{kernels_ms:.1f}",
        f"{blas_ms:.1f}",
        *per_row,
        f"{kernels_ms / blas_ms:.2f}",
    ]


if __name__ == "__main__":
    main()
