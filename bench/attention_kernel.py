"""Decode attention alone: the compiled paged-attention call of one step, for every layer of
the default model's shape (30 layers, 9 query heads over 3 KV heads of 64), R rows of C
positions each, with the rows' blocks laid out three ways: each sequence its own blocks in
order, the same blocks scattered through the pool, and one sequence shared by every row (its
keys and values stay in cache). Then prefill chunks: one chunk's attention over its
sequence through the compiled kernel (what runs with the C kernels) against the gather path
(keys gathered per layer, BLAS and NumPy's softmax: the Numba fallback's and CuPy's).

    .venv/bin/python -m bench.attention_kernel [--rows R] [--context C] [--rounds N]
        [--kv-dtype float32|float16]

Prints two tables: time per step (all layers), bytes read and rate; time per chunk.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.table import print_table
from engine.ops.attention import AttentionPlan, paged_attention
from engine.ops.attention_rows import rows_kernel
from engine.ops.kernels import SMALL_ROWS

LAYERS, HEADS, KV_HEADS, DIM, BLOCK = 30, 9, 3, 64, 16
CHUNKS = ((0, 256), (444, 256), (1900, 64), (0, 512))  # (start position, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--context", type=int, default=850)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--kv-dtype",
        choices=("float32", "float16"),
        default="float32",
        help="the pool's keys and values (the engine's default is float16)",
    )
    args = parser.parse_args()
    kv = np.dtype(args.kv_dtype)
    rows, ctx = args.rows, args.context
    nb = -(-ctx // BLOCK)
    rng = np.random.default_rng(0)
    shape = (LAYERS, rows * nb, KV_HEADS, BLOCK, DIM)
    k = rng.standard_normal(shape, dtype=np.float32).astype(kv)
    v = rng.standard_normal(shape, dtype=np.float32).astype(kv)
    q = rng.standard_normal((rows, HEADS, DIM), dtype=np.float32)
    out = np.empty_like(q)
    lengths = np.full(rows, ctx, np.int32)
    layouts = {
        "each row its blocks, in order": np.arange(rows * nb, dtype=np.int32).reshape(rows, nb),
        "each row its blocks, scattered": rng.permutation(rows * nb)
        .astype(np.int32)
        .reshape(rows, nb),
        "one sequence for every row": np.tile(np.arange(nb, dtype=np.int32), (rows, 1)),
    }
    kernel = rows_kernel()
    table = []
    for name, tables in layouts.items():
        best = float("inf")
        for _ in range(args.rounds):
            t = time.perf_counter()
            for layer in range(LAYERS):
                kernel(q, k[layer], v[layer], tables, lengths, DIM**-0.5, out)
            best = min(best, time.perf_counter() - t)
        sequences = 1 if name.startswith("one") else rows
        read = sequences * LAYERS * KV_HEADS * ctx * DIM * kv.itemsize * 2
        flops = rows * LAYERS * HEADS * ctx * DIM * 4
        table.append((name, f"{best * 1e3:.2f}", f"{read / 1e6:.0f}", f"{read / best / 1e9:.1f}",
                      f"{flops / best / 1e9:.1f}"))  # fmt: skip
    print(f"{rows} rows x {ctx} positions, {LAYERS} layers, {kv.name} KV, best of {args.rounds}")
    print_table(("blocks", "ms per step", "MB of K/V", "GB/s", "GFLOP/s"), table)
    print()
    print(f"one prefill chunk's attention, {LAYERS} layers, best of {args.rounds}")
    print_table(("start", "rows", "kernel (ms)", "gather (ms)"), chunk_rows(rng, args.rounds, kv))


def chunk_rows(rng: np.random.Generator, rounds: int, kv: np.dtype) -> list[tuple[str, ...]]:
    table = []
    for start, n in CHUNKS:
        blocks = list(range(-(-(start + n) // BLOCK)))
        shape = (len(blocks), KV_HEADS, BLOCK, DIM)
        k = rng.standard_normal(shape, dtype=np.float32).astype(kv)
        v = rng.standard_normal(shape, dtype=np.float32).astype(kv)
        q = rng.standard_normal((n, HEADS, DIM), dtype=np.float32)
        times = []
        for limit in (None, SMALL_ROWS):
            plan = AttentionPlan.build([(blocks, start, n)], limit, compiled=True)
            best = float("inf")
            for _ in range(rounds):
                t = time.perf_counter()
                for _layer in range(LAYERS):
                    paged_attention(q, k, v, plan, np)
                best = min(best, time.perf_counter() - t)
            times.append(f"{best * 1e3:.1f}")
        table.append((str(start), str(n), *times))
    return table


if __name__ == "__main__":
    main()
