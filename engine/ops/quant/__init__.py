"""Quantized weights: GGUF blocks kept in memory and multiplied without expanding to float.

formats.py turns GGUF blocks into codes and scales; matrix.py holds them; engine/ops/csrc/
qmatmul.c (built by engine/ops/native.py, bound in native.py) and fallback.py multiply.
`kernels()` picks the C kernels where they build and Numba's otherwise;
WARMFLEET_KERNELS=numba forces the latter.
"""

from __future__ import annotations

import functools
from typing import Protocol

import numpy as np

from engine.ops.quant import fallback, native
from engine.ops.quant.matrix import QuantMatrix
from engine.ops.quant.native import BlasChunks


class Kernels(Protocol):
    name: str
    # the longest prefill chunk the kernels take (None: every one); longer ones go to BLAS
    # on expanded weights
    chunk_rows: int | None
    # long chunks multiplied by BLAS from the kernels' threads (None: NumPy calls BLAS)
    blas: BlasChunks | None

    def matmul(self, w: QuantMatrix, x: np.ndarray, out: np.ndarray, threads: int) -> None: ...

    def dequant(self, w: QuantMatrix, rows: np.ndarray, out: np.ndarray, threads: int) -> None: ...


@functools.cache
def kernels() -> Kernels:
    """This process's quantized kernels, chosen (and compiled, if need be) once."""
    compiled = native.load()
    return compiled if compiled is not None else fallback.NumbaKernels()
