"""A layer's experts on the GPU, and the products of a step's (row, expert) pairs in one
launch each (engine/ops/csrc/qmatmul.cu's wf_qmatmul_grouped).

The E experts' [N, K] matrices of a tensor are one GpuQuantMatrix of E * N rows in the
kernels' form (formats.py: the K-quants' codes and scales as decoded), or, for MXFP4, its
nibbles as the file has them with each block's power-of-two scale (KIND_FP4: `fp4_form`),
and for F32 experts their float32 bytes as they are (KIND_F32). A step's pairs come grouped
by expert (engine/ops/moe.py's buckets, on the device); `tile_plan` cuts each
expert's run into tiles of up to TILE_ROWS pairs, one grid row each, on the device too: a
step reads nothing back, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import gguf
import numpy as np

from engine.ops.gpu_ops import compiled
from engine.ops.quant.cuda import TILE_ROWS, WARPS, GpuQuantMatrix
from engine.ops.quant.experts import ExpertMatrix
from engine.ops.quant.formats import decode
from engine.ops.quant.matrix import QuantMatrix

KIND_FP4 = 9  # as in qmatmul.cu: MXFP4's nibbles through their table, times 2^(e - 128)
MXFP4_BLOCK = 17  # bytes: an E8M0 exponent, then 16 bytes of two E2M1 values each
MAX_GRID_Y = 65535  # CUDA's bound on a grid's second dimension: tiles a launch
Array = Any  # cupy.ndarray


@dataclass(frozen=True, slots=True)
class GpuExperts:
    """E experts' [N, K] matrices, one after another in `matrix` ([E * N, K])."""

    matrix: GpuQuantMatrix
    num_experts: int

    @classmethod
    def upload(cls, m: ExpertMatrix, xp: ModuleType) -> GpuExperts:
        if m.packed:
            raise ValueError("a packed matrix is read by the CPU's kernels alone")
        rows = m.data.reshape(m.num_experts * m.n, -1)  # a view of the file's blocks
        if m.qtype == gguf.GGMLQuantizationType.F32:
            matrix = GpuQuantMatrix.of_float32(rows, m.k, xp)
        elif m.qtype == gguf.GGMLQuantizationType.MXFP4:
            codes, scale = fp4_form(rows)
            empty = xp.zeros((len(rows), 0), dtype=np.float32)
            matrix = GpuQuantMatrix(
                KIND_FP4, 32, xp.asarray(codes), xp.asarray(scale), empty, m.k, "MXFP4"
            )
        else:
            decoded = QuantMatrix.from_decoded(decode(rows, m.qtype), m.qtype.name)
            matrix = GpuQuantMatrix.upload(decoded, xp)
        return cls(matrix, m.num_experts)

    @property
    def n(self) -> int:
        return self.matrix.shape[0] // self.num_experts

    @property
    def nbytes(self) -> int:
        return self.matrix.nbytes


def fp4_form(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MXFP4 rows [R, row bytes] as KIND_FP4 reads them: the blocks' nibbles as they lie
    ([R, K / 2]: byte j of a block holds its values j and j + 16, Q4's layout) and each
    block's scale 2^(e - 128) ([R, K / 32] float32; formats.MXFP4_VALUES are twice E2M1's
    values): 0.625 bytes a weight, where the 8-bit codes of the CPU's form take 1.25 (the
    difference between gpt-oss-120b fitting a GB10's 128 GB or not)."""
    b = rows.reshape(len(rows), -1, MXFP4_BLOCK)
    scale = np.ldexp(np.float32(1), b[..., 0].astype(np.int32) - 128).astype(np.float32)
    return np.ascontiguousarray(b[..., 1:].reshape(len(rows), -1)), scale


def tile_plan(starts: Array, pairs: int, xp: ModuleType) -> Array:
    """[3, T] int32: each tile's expert, first pair and pair count (up to TILE_ROWS), for
    `pairs` pairs grouped by expert with expert e's from starts[e] to starts[e + 1]
    ([E + 1]), worked out on the device: T is the most tiles any routing of `pairs` pairs
    can take (a step's grid is fixed by its shape: a captured graph's is), and the tiles
    past the routing's own count hold no pairs (the kernel skips them)."""
    num_experts = len(starts) - 1
    per = (starts[1:] - starts[:-1] + TILE_ROWS - 1) // TILE_ROWS  # tiles of each expert
    offsets = xp.concatenate([xp.zeros(1, dtype=np.int64), xp.cumsum(per)])
    t = xp.arange(-(-pairs // TILE_ROWS) + min(num_experts, pairs), dtype=np.int64)
    expert = xp.clip(xp.searchsorted(offsets, t, side="right") - 1, 0, num_experts - 1)
    first = starts[expert] + (t - offsets[expert]) * TILE_ROWS
    rows = xp.clip(starts[expert + 1] - first, 0, TILE_ROWS)
    return xp.stack([expert, first, rows]).astype(np.int32)


def grouped_matmul_t(x: Array, w: GpuExperts, pair_rows: Array, tiles: Array) -> Array:
    """[P, w.n]: pair p is row x[pair_rows[p]] times its tile's expert's matrix,
    transposed; x [R, K] float32, pair_rows [P] int64, tiles [3, T] int32 (tile_plan's:
    every pair in one tile)."""
    cupy = importlib.import_module("cupy")
    x = cupy.ascontiguousarray(x, dtype=cupy.float32)
    pair_rows = cupy.ascontiguousarray(pair_rows, dtype=cupy.int64)
    out = cupy.empty((len(pair_rows), w.n), dtype=cupy.float32)
    m = w.matrix
    sizes = (np.int32(w.n), np.int32(m.k), np.int64(m.codes.shape[1]))
    for a in range(0, tiles.shape[1], MAX_GRID_Y):
        part = cupy.ascontiguousarray(tiles[:, a : a + MAX_GRID_Y], dtype=cupy.int32)
        args = (*m._args(), x, pair_rows, part, np.int32(part.shape[1]), out, *sizes)
        grid = (-(-w.n // WARPS), part.shape[1])
        compiled("qmatmul.cu").get_function("wf_qmatmul_grouped")(grid, (32 * WARPS,), args)
    return out
