"""What a mixture-of-experts decode step's parts cost, each product timed alone (best of 5)
at 1, 8 and 32 rows: the vocabulary matrix, one layer's experts (through the kernels' own
routing, with the experts they touched and the bytes read) and its attention matrices:

    .venv/bin/python -m bench.moe_parts --model FILE [--threads 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.table import print_table
from engine.device import set_threads
from engine.model import Model
from engine.ops.kernels import matmul_t
from engine.ops.moe import moe_ffn


def best_ms(run: Callable[[], object], repeats: int = 5) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def part_row(model: Model, b: int, rng: np.random.Generator) -> list[str]:
    """The table's row for a step of b rows."""
    w, lw, c = model.weights, model.weights.layers[0], model.config
    moe = lw.moe
    assert moe is not None
    x = rng.standard_normal((b, c.dim)).astype(np.float32)
    attn_in = rng.standard_normal((b, c.q_dim)).astype(np.float32)
    vocab_ms = best_ms(lambda: matmul_t(x, w.output))
    before = moe.stats.copy()
    moe_ffn(x, moe)
    touched, read = (int(v) for v in (moe.stats - before)[1:])
    experts_ms = best_ms(lambda: moe_ffn(x, moe))
    attn_ms = best_ms(lambda: matmul_t(x, lw.wqkv)) + best_ms(lambda: matmul_t(attn_in, lw.wo))
    rate = read / experts_ms / 1e6
    experts = f"{experts_ms:.1f} ms ({touched}, {read / 1e6:.0f} MB, {rate:.1f} GB/s)"
    vocab = f"{vocab_ms:.1f} ms ({w.output.nbytes / vocab_ms / 1e6:.0f} GB/s)"
    return [str(b), vocab, experts, f"{attn_ms:.1f} ms"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True, metavar="FILE")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    set_threads(args.threads)
    model = Model.load(args.model)
    rng = np.random.default_rng(0)
    if model.weights.layers[0].moe is None:
        raise SystemExit(f"{args.model.name} has no experts")
    rows = [part_row(model, b, rng) for b in (1, 8, 32)]
    heads = ["rows", "vocabulary matrix", "a layer's experts (touched, read, rate)", "qkv + wo"]
    print_table(heads, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
