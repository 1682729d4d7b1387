"""CPU matrix products for decode rows, compiled with Numba, and the rule that splits a step's
rows between them and BLAS.

Batch invariance: a sequence's logits must be bit for bit the same whatever else runs in the
step. A BLAS call sums a row in an order that depends on how many rows come with it, and a
kernel that blocks several rows together sums a row in a block differently from a tail row
(fastmath lets LLVM vectorize each loop its own way). So the kernel here runs every
activation row through one and the same loop, one row at a time; decode rows always go
through it, and only prefill chunks longer than SMALL_ROWS go to BLAS, each in a call of its
own. Streaming each weight block once for all rows keeps it in cache for the next row, so
one row at a time costs little (see bench/RESULTS.md). Quantized weights with the C
kernels take longer chunks as their build allows (engine/ops/chunks.py, Kernels.chunk_rows):
every row on an AVX-512 CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import config, get_num_threads, njit, prange, set_num_threads

from engine.ops.chunks import SMALL_ROWS
from engine.ops.quant import kernels as quant_kernels
from engine.ops.quant.cuda import GpuQuantMatrix
from engine.ops.quant.cuda import matmul_t as gpu_matmul_t
from engine.ops.quant.experts import ExpertMatrix, InPlaceRows
from engine.ops.quant.experts_native import expert_matmul
from engine.ops.quant.matrix import QuantMatrix

MAX_THREADS: int = config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # pool size at start
SCRATCH_BYTES = 32 << 20  # at most this much of a quantized matrix expanded for BLAS at once
Array = Any
# a step's rows as consecutive runs: (start, stop, True when the kernel computes them)
RowRuns = tuple[tuple[int, int, bool], ...]

__all__ = [
    "MAX_THREADS",
    "SMALL_ROWS",
    "RowRuns",
    "get_num_threads",
    "matmul_t",
    "plan_rows",
    "set_num_threads",
]


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _rows_kernel(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    # x: [M, K], w: [N, K] -> out: [M, N] = x @ w.T
    # 8 weight rows per task, held in cache while each activation row passes over them; the
    # N % 8 last weight rows are tasks of one row each. Every output element is computed by
    # the loop of its column's task, whatever M is and wherever its row sits.
    m_rows, k_dim = x.shape
    num_blocks = w.shape[0] // 8
    num_tail = w.shape[0] - num_blocks * 8
    for task in prange(num_blocks + num_tail):
        if task < num_blocks:
            n = task * 8
            for m in range(m_rows):
                a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
                for k in range(k_dim):
                    v = x[m, k]
                    a0 += v * w[n, k]
                    a1 += v * w[n + 1, k]
                    a2 += v * w[n + 2, k]
                    a3 += v * w[n + 3, k]
                    a4 += v * w[n + 4, k]
                    a5 += v * w[n + 5, k]
                    a6 += v * w[n + 6, k]
                    a7 += v * w[n + 7, k]
                out[m, n], out[m, n + 1], out[m, n + 2], out[m, n + 3] = a0, a1, a2, a3
                out[m, n + 4], out[m, n + 5], out[m, n + 6], out[m, n + 7] = a4, a5, a6, a7
        else:
            n = num_blocks * 8 + task - num_blocks
            for m in range(m_rows):
                a0 = np.float32(0.0)
                for k in range(k_dim):
                    a0 += x[m, k] * w[n, k]
                out[m, n] = a0


def plan_rows(lengths: Sequence[int], small_rows: int | None = SMALL_ROWS) -> RowRuns:
    """The runs of a step whose segments have these lengths (in row order): chunks longer
    than `small_rows` (None: none) go to BLAS one by one, every other row to the kernel."""
    runs: list[tuple[int, int, bool]] = []
    row = 0
    for n in lengths:
        kernel = small_rows is None or n <= small_rows
        if runs and kernel and runs[-1][2]:
            runs[-1] = (runs[-1][0], row + n, True)
        elif n:
            runs.append((row, row + n, kernel))
        row += n
    return tuple(runs)


def matmul_t(
    x: Array,
    w: Array | QuantMatrix | GpuQuantMatrix | ExpertMatrix | InPlaceRows,
    runs: RowRuns | None = None,
) -> Array:
    """x @ w.T for x [M, K] and w [N, K]. On NumPy float32 the rows go as `runs` says (None:
    all through the kernel); a matrix in the file's blocks (one expert, or several side by
    side) through the grouped kernel, every row; quantized weights on a GPU through its
    kernel; anything else is one matmul of the array module."""
    if isinstance(w, (ExpertMatrix, InPlaceRows)):
        return _in_place_matmul(np.ascontiguousarray(x, dtype=np.float32), w)
    if isinstance(w, QuantMatrix):
        return _quant_matmul(np.ascontiguousarray(x, dtype=np.float32), w, runs)
    if isinstance(w, GpuQuantMatrix):
        return gpu_matmul_t(x, w)  # every row through the GPU kernel
    if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and w.dtype == np.float32):
        return x @ w.T
    if runs is None:
        runs = ((0, x.shape[0], True),)
    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    w = np.ascontiguousarray(w)
    kernels, chunks = quant_kernels(), [(start, stop) for start, stop, k in runs if not k]
    for start, stop, kernel in runs:
        if kernel:
            _rows_kernel(np.ascontiguousarray(x[start:stop]), w, out[start:stop])
        elif kernels.blas is None:
            np.matmul(x[start:stop], w.T, out=out[start:stop])
    if chunks and kernels.blas is not None:  # from the kernels' threads (blas_chunks.c)
        rows = np.arange(w.shape[0], dtype=np.int64)
        x = np.ascontiguousarray(x)
        kernels.blas(w, rows, x, _chunk_array(chunks), out, 0, None, get_num_threads())
    return out


def kernel_runs(runs: RowRuns) -> RowRuns:
    """`runs` as the quantized kernels take them: a long chunk as long as they take
    (Kernels.chunk_rows, engine/ops/chunks.py) goes to them too, with the runs beside it."""
    limit = quant_kernels().chunk_rows
    taken: list[tuple[int, int, bool]] = []
    for start, stop, kernel in runs:
        kernel = kernel or limit is None or stop - start <= limit
        if taken and kernel and taken[-1][2]:
            taken[-1] = (taken[-1][0], stop, True)
        else:
            taken.append((start, stop, kernel))
    return tuple(taken)


def _quant_matmul(x: np.ndarray, w: QuantMatrix, runs: RowRuns | None) -> np.ndarray:
    """matmul_t on quantized weights: kernel rows, and the long chunks the kernels take
    (`kernel_runs`: every one on AVX-512), in the kernel; any longer chunk with BLAS against
    the weights expanded into a scratch buffer (in slabs of rows for a large matrix, once
    for all the step's long chunks), reused from call to call."""
    kernels, threads = quant_kernels(), get_num_threads()
    n = w.shape[0]
    out = np.empty((x.shape[0], n), dtype=np.float32)
    runs = kernel_runs(runs or ((0, x.shape[0], True),))
    for start, stop, _ in (r for r in runs if r[2]):
        kernels.matmul(w, x[start:stop], out[start:stop], threads)
    chunks = [(start, stop) for start, stop, kernel in runs if not kernel]
    slab_rows = max(1, min(n, SCRATCH_BYTES // (4 * w.k)))
    for n0 in range(0, n if chunks else 0, slab_rows):
        rows = np.arange(n0, min(n, n0 + slab_rows), dtype=np.int64)
        slab = _scratch.take(len(rows), w.k)
        if kernels.blas is not None:  # expanded and multiplied on the kernels' threads
            kernels.blas(w, rows, x, _chunk_array(chunks), out, n0, slab, threads)
            continue
        kernels.dequant(w, rows, slab, threads)
        for start, stop in chunks:  # each chunk a BLAS call of its own (batch invariance)
            if len(rows) == n:
                np.matmul(x[start:stop], slab.T, out=out[start:stop])
            else:
                out[start:stop, n0 : n0 + len(rows)] = x[start:stop] @ slab.T
    return out


def _in_place_matmul(x: np.ndarray, w: ExpertMatrix | InPlaceRows) -> np.ndarray:
    """x [M, K] through the one expert w (or each of w's, into its columns): every row in
    one bucket, each computed alike."""
    out = np.empty((x.shape[0], w.n), dtype=np.float32)
    if not len(x):  # a step whose chunks want no logits
        return out
    rows, starts = np.arange(x.shape[0], dtype=np.int64), np.array([0, len(x)], dtype=np.int64)
    col = 0
    for part in w.parts if isinstance(w, InPlaceRows) else (w,):
        expert_matmul(part, x, rows, starts, out[:, col : col + part.n], get_num_threads())
        col += part.n
    return out


def _chunk_array(chunks: list[tuple[int, int]]) -> np.ndarray:
    return np.array(chunks, dtype=np.int64).reshape(-1, 2)


class _Scratch:
    """One float32 buffer, grown as needed: a fresh one per call would fault its pages in
    every time (7 MB per matrix, 120 matrices per step for the default model)."""

    def __init__(self) -> None:
        self._buf = np.empty(0, dtype=np.float32)

    def take(self, rows: int, cols: int) -> np.ndarray:
        if self._buf.size < rows * cols:
            self._buf = np.empty(rows * cols, dtype=np.float32)
        return self._buf[: rows * cols].reshape(rows, cols)


_scratch = _Scratch()  # process-wide, like the thread pools; the engine steps one at a time
