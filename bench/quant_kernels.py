"""The matrix products of one decode step, alone: every layer matrix of the model in turn
(so the weights stream from memory, as in a step), by activation row count, for the C
kernels on quantized weights, their Numba fallback, and the float32 row kernel on the
expanded weights.

    .venv/bin/python -m bench.quant_kernels [--model PATH] [--threads N] [--rounds R]

Prints a table; rounds alternate between the three, and each figure is the best round.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.table import print_table
from engine.device import set_threads
from engine.model import Model
from engine.ops.kernels import matmul_t
from engine.ops.quant import Kernels, fallback, native
from engine.ops.quant.matrix import QuantMatrix
from warmfleet.models import resolve_model

ROWS = (1, 2, 4, 8, 16, 32)


def layer_matrices(model: Model) -> list[Any]:
    return [m for lw in model.weights.layers for m in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down)]


def quantized_run(
    kernels: Kernels, matrices: list[QuantMatrix], xs: dict[int, np.ndarray], threads: int
) -> Callable[[], None]:
    outs = [np.empty((xs[m.k].shape[0], m.shape[0]), np.float32) for m in matrices]

    def run() -> None:
        for m, out in zip(matrices, outs, strict=True):
            kernels.matmul(m, xs[m.k], out, threads)

    return run


def float32_run(matrices: list[np.ndarray], xs: dict[int, np.ndarray]) -> Callable[[], None]:
    def run() -> None:
        for m in matrices:
            matmul_t(xs[m.shape[1]], m)

    return run


def timed(run: Callable[[], None]) -> float:
    t = time.perf_counter()
    run()
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", metavar="PATH")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    threads = set_threads(args.threads)
    path = resolve_model(args.model)
    quantized = layer_matrices(Model.load(path, device="cpu", weights="quantized"))
    expanded = layer_matrices(Model.load(path, device="cpu", weights="float32"))
    assert all(isinstance(m, QuantMatrix) for m in quantized)
    kernels: dict[str, Kernels] = {"numba": fallback.NumbaKernels()}
    compiled = native.load()
    if compiled is not None:
        kernels["c"] = compiled
    weights = sum(m.shape[0] * m.shape[1] for m in quantized)
    rows = []
    for m_rows in ROWS:
        rng = np.random.default_rng(m_rows)
        xs = {
            k: rng.standard_normal((m_rows, k)).astype(np.float32) for k in {m.k for m in quantized}
        }
        runs = {name: quantized_run(k, quantized, xs, threads) for name, k in kernels.items()}
        runs["f32"] = float32_run(expanded, xs)
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(args.rounds):
            for name, run in runs.items():
                best[name] = min(best[name], timed(run))
        cells = [f"{best[n] * 1e3:.2f} ms, {weights * m_rows / best[n] / 1e9:.1f}"
                 if n in best else "-" for n in ("c", "numba", "f32")]  # fmt: skip
        rows.append((str(m_rows), *cells))
    print(f"{weights / 1e6:.0f}M weights in {len(quantized)} layer matrices, {threads} threads;"
          " each cell: time for all of them, Gw*rows/s")  # fmt: skip
    print_table(("rows", "quantized, C", "quantized, Numba", "float32 kernel"), rows)


if __name__ == "__main__":
    main()
