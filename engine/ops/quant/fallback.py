"""The same products as qmatmul.c in Numba, for machines without a C compiler (and as a
second implementation the tests hold against the first). Slower: LLVM does not vectorize
the nibble unpacking as well. Batch invariant the same way: every activation row goes
through one and the same loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numba import njit, prange

from engine.ops.chunks import SMALL_ROWS
from engine.ops.quant.formats import KIND_BF16, KIND_F16, KIND_Q4
from engine.ops.quant.matrix import QuantMatrix

if TYPE_CHECKING:
    from engine.ops.quant.native import BlasChunks

ROWS = 4  # weight rows per task, as in qmatmul.c


@njit(cache=True, nogil=True)
def _half(h):  # type: ignore[no-untyped-def]  # pragma: no cover
    # IEEE half bits -> float32, exactly: (1024 + mantissa) * 2^(exponent - 25)
    e, mant = (h >> 10) & 0x1F, h & 0x3FF
    if e == 31:
        v = np.float32(np.inf) if mant == 0 else np.float32(np.nan)
    elif e == 0:
        v = np.float32(mant) * np.float32(2.0**-24)
    else:
        v = np.float32(1024 + mant) * np.float32(2.0 ** (np.int64(e) - 25))
    return -v if h & 0x8000 else v


@njit(cache=True, nogil=True)
def _bfloat(h):  # type: ignore[no-untyped-def]  # pragma: no cover
    return np.array([h << 16], dtype=np.uint32).view(np.float32)[0]


@njit(cache=True, nogil=True, inline="always")
def _dequant_row(kind, gshift, codes, scale, offset, k, n, dst):  # type: ignore[no-untyped-def]  # pragma: no cover
    if kind == KIND_Q4:
        for b in range(k // 32):
            s, o = scale[n, (32 * b) >> gshift], offset[n, (32 * b) >> gshift]
            s2, o2 = scale[n, (32 * b + 16) >> gshift], offset[n, (32 * b + 16) >> gshift]
            for j in range(16):
                c = codes[n, 16 * b + j]
                dst[32 * b + j] = np.float32(c & 15) * s + o
                dst[32 * b + 16 + j] = np.float32(c >> 4) * s2 + o2
    elif kind in (KIND_F16, KIND_BF16):
        for i in range(k):
            h = np.uint32(codes[n, 2 * i]) | (np.uint32(codes[n, 2 * i + 1]) << 8)
            dst[i] = _half(h) if kind == KIND_F16 else _bfloat(h)
    else:
        for i in range(k):
            dst[i] = np.float32(codes[n, i]) * scale[n, i >> gshift] + offset[n, i >> gshift]


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _matmul(kind, gshift, codes, scale, offset, k, x, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    n_rows = out.shape[1]
    for t in prange((n_rows + ROWS - 1) // ROWS):
        buf = np.empty((ROWS, k), dtype=np.float32)
        n0 = t * ROWS
        nr = min(ROWS, n_rows - n0)
        for j in range(nr):
            _dequant_row(kind, gshift, codes, scale, offset, k, n0 + j, buf[j])
        for m in range(x.shape[0]):
            for j in range(nr):
                acc = np.float32(0.0)
                for i in range(k):
                    acc += x[m, i] * buf[j, i]
                out[m, n0 + j] = acc


@njit(parallel=True, cache=True, nogil=True)
def _dequant(kind, gshift, codes, scale, offset, k, rows, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    for i in prange(rows.shape[0]):
        _dequant_row(kind, gshift, codes, scale, offset, k, rows[i], out[i])


class NumbaKernels:
    name = "numba"
    # per-row scalar loops: BLAS on expanded weights is faster for longer chunks
    chunk_rows: int | None = SMALL_ROWS
    blas: BlasChunks | None = None  # long chunks: NumPy calls BLAS

    # Numba reads no float16 on the CPU: float16 groups are widened for each call (exact)

    def matmul(self, w: QuantMatrix, x: np.ndarray, out: np.ndarray, threads: int) -> None:
        _matmul(w.kind, w.gshift, w.codes, *w.float32_groups(), w.k, x, out)

    def dequant(self, w: QuantMatrix, rows: np.ndarray, out: np.ndarray, threads: int) -> None:
        _dequant(w.kind, w.gshift, w.codes, *w.float32_groups(), w.k, rows, out)
