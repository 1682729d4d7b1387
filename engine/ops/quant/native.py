"""ctypes bindings of the quantized-weight products in engine/ops/csrc/qmatmul.c."""

from __future__ import annotations

import ctypes

import numpy as np

from engine.ops import blas, native
from engine.ops.blas import Sgemm
from engine.ops.chunks import kernel_chunk_rows
from engine.ops.native import address
from engine.ops.quant.matrix import QuantMatrix

NO_DEQUANT = -1  # blas_chunks.c's kind for float32 weight rows


class NativeKernels:
    """wf_matmul and wf_dequant, and BlasChunks where it runs."""

    name = "c"

    def __init__(self, lib: ctypes.CDLL) -> None:
        # Every row, long prefill chunks too, where a 16-lane vector is one register
        # (AVX-512): on 2 Zen 4 cores as fast as expanding the weights for BLAS, with no
        # expansion and no hand-over between BLAS's and OpenMP's threads (each woke the
        # other's sleeping thread: ~0.5 ms, several times a layer): a 512-token prefill
        # 1.08-1.15 s -> 0.73-0.75 s (bench/RESULTS.md). Built for AVX2 chunks of up to
        # 128 rows; longer ones go to BLAS (engine/ops/chunks.py).
        self.chunk_rows = kernel_chunk_rows()
        p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        self._matmul = lib.wf_matmul
        self._matmul.argtypes = [i, i, p, p, p, i64, i64, p, i64, p, i64, i]
        self._matmul.restype = i64  # 0, or the scratch bytes refused
        self._dequant = lib.wf_dequant
        self._dequant.argtypes = [i, i, p, p, p, i64, p, i64, p, i]
        self._dequant.restype = i64
        # long chunks through BLAS from these kernels' threads, where the process's BLAS is
        # an OpenBLAS whose sgemm they can call
        sgemm = blas.POOL.sgemm_for_kernels()
        self.blas = BlasChunks(lib, sgemm) if sgemm is not None else None

    def matmul(self, w: QuantMatrix, x: np.ndarray, out: np.ndarray, threads: int) -> None:
        """out[M, N] = x[M, K] @ w.T; x and out C-contiguous float32. MemoryError (nothing
        done) where the kernel's scratch cannot be allocated."""
        codes, scale, offset = w.pointers
        n, m = out.shape[1], x.shape[0]
        refused = self._matmul(
            w.c_kind,
            w.gshift,
            codes,
            scale,
            offset,
            n,
            w.k,
            address(x),
            m,
            address(out),
            n,
            threads,
        )
        if refused:
            raise native.scratch_refused(
                "wf_matmul", refused, f"a {m}-row product of [{n}, {w.k}] weights"
            )

    def dequant(self, w: QuantMatrix, rows: np.ndarray, out: np.ndarray, threads: int) -> None:
        """out[i] = row rows[i] of w as float32; rows int64, out [len(rows), K]. MemoryError
        (nothing done) where the kernel's scratch cannot be allocated."""
        codes, scale, offset = w.pointers
        refused = self._dequant(
            w.c_kind,
            w.gshift,
            codes,
            scale,
            offset,
            w.k,
            address(rows),
            len(rows),
            address(out),
            threads,
        )
        if refused:
            raise native.scratch_refused(
                "wf_dequant", refused, f"{len(rows)} rows of [{w.shape[0]}, {w.k}] weights"
            )


class BlasChunks:
    """wf_blas_chunks (engine/ops/csrc/blas_chunks.c): long chunks multiplied by BLAS's sgemm
    from the kernels' own threads."""

    def __init__(self, lib: ctypes.CDLL, sgemm: Sgemm) -> None:
        self.sgemm = sgemm
        p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        self._fn = lib.wf_blas_chunks
        self._fn.argtypes = [i, i, p, p, p, i64, p, i64, p, p, i64, p, i64, p, p, i, i]
        self._fn.restype = i64  # 0, or the scratch bytes refused

    def __call__(
        self,
        w: QuantMatrix | np.ndarray,
        rows: np.ndarray,
        x: np.ndarray,
        chunks: np.ndarray,
        out: np.ndarray,
        col: int,
        slab: np.ndarray | None,
        threads: int,
    ) -> None:
        """out[start:stop, col + i] = x[start:stop] . row rows[i] of w, for each (start, stop)
        in chunks (int64 [C, 2]), each chunk an sgemm call of its own on every thread: a
        QuantMatrix's rows expanded into slab [len(rows), K] first, a float32 w's
        (C-contiguous, rows[0] on) used in place. x and out C-contiguous float32."""
        if isinstance(w, QuantMatrix):
            kind, gshift, (codes, scale, offset), k = w.c_kind, w.gshift, w.pointers, w.k
        else:
            kind, gshift, k = NO_DEQUANT, 0, w.shape[1]
            codes, scale, offset = address(w) + 4 * k * int(rows[0]), 0, 0
        refused = self._fn(
            kind,
            gshift,
            codes,
            scale,
            offset,
            k,
            address(rows),
            len(rows),
            address(x),
            address(chunks),
            len(chunks),
            address(out) + 4 * col,
            out.shape[1],
            address(slab) if slab is not None else 0,
            self.sgemm.address,
            int(self.sgemm.ilp64),
            threads,
        )
        if refused:
            raise native.scratch_refused(
                "wf_blas_chunks", refused, f"{len(rows)} rows of [{w.shape[0]}, {k}] weights"
            )


def load() -> NativeKernels | None:
    """The compiled products; None where the C kernels cannot be built."""
    lib = native.library()
    return NativeKernels(lib) if lib is not None else None
