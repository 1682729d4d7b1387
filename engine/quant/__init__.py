"""Quantized weights: GGUF blocks kept in memory and multiplied without expanding to float.

formats.py turns GGUF blocks into codes and scales; matrix.py holds them; qmatmul.c (built
by native.py) and fallback.py multiply. `kernels()` picks the C kernels where they build
and Numba's otherwise; WARMFLEET_KERNELS=numba forces the latter.
"""

from __future__ import annotations

import functools
import os
from typing import Protocol

import numpy as np

from engine.quant.matrix import QuantMatrix


class Kernels(Protocol):
    name: str

    def matmul(self, w: QuantMatrix, x: np.ndarray, out: np.ndarray, threads: int) -> None: ...

    def dequant(self, w: QuantMatrix, rows: np.ndarray, out: np.ndarray, threads: int) -> None: ...


@functools.cache
def kernels() -> Kernels:
    """This process's quantized kernels, chosen (and compiled, if need be) once."""
    from engine.quant import fallback, native

    if os.environ.get("WARMFLEET_KERNELS", "").lower() != "numba":
        compiled = native.load()
        if compiled is not None:
            return compiled
    return fallback.NumbaKernels()
