"""Quantized matrices on the GPU: the kernels' form (formats.py) in CuPy arrays, multiplied
by engine/ops/csrc/qmatmul.cu (compiled by CuPy's NVRTC on first use: engine/ops/gpu_ops.py).

Activations and sums are float32, the weights dequantized in registers: the results equal
the float32 product of gguf's dequantized weights up to summation order (tests/unit/
test_cuda_kernels.py, run where a GPU is found), and each row's bits do not depend on the
rows computed with it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from engine.ops.gpu_ops import compiled
from engine.ops.quant.matrix import QuantMatrix

TILE_ROWS, WARPS = 8, 8  # as in qmatmul.cu: activation rows per warp, output columns per block
KIND_F32 = 8  # as in qmatmul.cu: float32 weights as they are (GPU only)
DEQUANT_THREADS = 256
Array = Any  # cupy.ndarray


@dataclass(frozen=True, slots=True)
class GpuQuantMatrix:
    """A QuantMatrix's arrays in GPU memory: codes [N, row bytes] uint8, scale and offset
    [N, K / group] float32 (empty for f16/bf16)."""

    kind: int
    group: int
    codes: Array
    scale: Array
    offset: Array
    k: int
    source: str

    @classmethod
    def upload(cls, m: QuantMatrix, xp: ModuleType) -> GpuQuantMatrix:
        # float16 groups widened (exact): the CUDA kernel reads float32 ones
        codes, scale, offset = (xp.asarray(a) for a in (m.codes, *m.float32_groups()))
        return cls(m.kind, m.group, codes, scale, offset, m.k, m.source)

    @classmethod
    def of_float32(cls, rows: np.ndarray, k: int, xp: ModuleType) -> GpuQuantMatrix:
        """Float32 weights as they are (KIND_F32): rows [N, K] float32, or their bytes [N,
        4 K]; K a multiple of 32. Products through the kernel, not the BLAS, keep a row's
        bits its own whatever the batch."""
        if k % 32:
            raise ValueError(f"the CUDA kernel reads rows of 32-weight units, not {k} weights")
        codes = np.ascontiguousarray(rows).view(np.uint8).reshape(len(rows), -1)
        empty = xp.zeros((len(rows), 0), dtype=np.float32)
        return cls(KIND_F32, 32, xp.asarray(codes), empty, empty, k, "F32")

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.codes.shape[0]), self.k)

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.scale.nbytes + self.offset.nbytes)

    def _args(self) -> tuple[Any, ...]:
        """The kernels' leading arguments: the arrays, kind, group shift and groups per row."""
        return (self.codes, self.scale, self.offset, np.int32(self.kind),
                np.int32(self.group.bit_length() - 1), np.int32(self.scale.shape[1]))  # fmt: skip


def matmul_t(x: Array, w: GpuQuantMatrix) -> Array:
    """x @ w.T for x [M, K] (cast to contiguous float32) -> [M, N] float32."""
    cupy = importlib.import_module("cupy")
    x = cupy.ascontiguousarray(x, dtype=cupy.float32)
    m_rows, n = x.shape[0], w.shape[0]
    out = cupy.empty((m_rows, n), dtype=cupy.float32)
    if m_rows == 0 or n == 0:
        return out
    grid = (-(-n // WARPS), -(-m_rows // TILE_ROWS))
    compiled("qmatmul.cu").get_function("wf_qmatmul")(
        grid, (32 * WARPS,),
        (*w._args(), x, out, np.int32(n), np.int32(w.k), np.int64(w.codes.shape[1]),
         np.int32(m_rows)),
    )  # fmt: skip
    return out


def dequant_rows(w: GpuQuantMatrix, ids: Array) -> Array:
    """The rows `ids` [R] of w as float32 [R, K] (an embedding lookup)."""
    cupy = importlib.import_module("cupy")
    ids = cupy.ascontiguousarray(ids, dtype=cupy.int64)
    out = cupy.empty((len(ids), w.k), dtype=cupy.float32)
    if len(ids):
        grid = (-(-w.k // DEQUANT_THREADS), len(ids))
        compiled("qmatmul.cu").get_function("wf_dequant_rows")(
            grid, (DEQUANT_THREADS,),
            (*w._args(), ids, out, np.int32(w.k), np.int64(w.codes.shape[1])),
        )  # fmt: skip
    return out
