"""Causal attention over the paged KV pool.

Where the C kernels build, every row of a step attends in one compiled call per layer: each
(row, KV head), or with rows enough each whole row, is a task that walks the row's block
table (engine/ops/csrc/attention.c), so a row is computed by the same loop whatever else is
in the step, and whatever chunk of its prompt it came in (batch invariant). Long prefill
chunks go there too: reading the keys from cache per row, with the kernel's vector exp,
beats gathering them and attending with BLAS and NumPy's softmax 2-3.5x (a 256-row chunk
over 700 positions: 66 against 131 ms for the 30 layers; bench/RESULTS.md). With only the
Numba fallback (no C compiler), prefill chunks longer than kernels.SMALL_ROWS gather their
sequence's keys and values once per layer and attend with BLAS. On CuPy float32 every row
of a step is one launch of engine/ops/csrc/attention.cu per layer (gpu_ops.paged_attention);
float16 takes the gather path for every segment.

Shapes: R query rows, H heads, Hkv KV heads, G = H / Hkv, D head_dim, B block size.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import numpy as np
from numba import get_num_threads, njit, prange

from engine.kv_files.kv_dtypes import Q8_0, dequantize, widened
from engine.ops import gpu_ops, native
from engine.ops.kernels import SMALL_ROWS
from engine.ops.native import address

Array = Any
# what the C kernels' pools may hold, and their functions
KERNEL_KV_DTYPES = {
    np.dtype(np.float32): "wf_paged_rows",
    np.dtype(np.float16): "wf_paged_rows_f16",
    Q8_0: "wf_paged_rows_q8",
}


def kernel_reads(kv_dtype: np.dtype[Any]) -> bool:
    """Whether the rows kernel reads a pool of this dtype in place: float32 always (C or
    Numba), float16 and q8_0 where the C kernels build (Numba's would widen the layer each
    call, so the gather path serves)."""
    return kv_dtype == np.float32 or (kv_dtype in KERNEL_KV_DTYPES and native.library() is not None)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _paged_rows(
    q: np.ndarray,  # [R, H, D]
    k: np.ndarray,  # [num_blocks, Hkv, B, D] (one layer)
    v: np.ndarray,
    tables: np.ndarray,  # [R, max_blocks] int32: the block ids of each row's sequence
    lengths: np.ndarray,  # [R] int32: how many keys each row sees (its position + 1)
    scale: float,
    out: np.ndarray,  # [R, H, D]
) -> None:  # pragma: no cover
    num_rows, num_heads, dim = q.shape
    hkv, bs = k.shape[1], k.shape[2]
    g = num_heads // hkv
    for task in prange(num_rows * hkv):
        r = task // hkv
        kh = task - r * hkv
        n = lengths[r]
        p = np.empty((g, n), dtype=np.float32)
        for t in range(n):
            blk = tables[r, t // bs]
            s = t - (t // bs) * bs
            for j in range(g):
                acc = np.float32(0.0)
                for d in range(dim):
                    acc += q[r, kh * g + j, d] * k[blk, kh, s, d]
                p[j, t] = acc * scale
        acc_v = np.zeros((g, dim), dtype=np.float32)
        for j in range(g):
            top = p[j, 0]
            for t in range(1, n):
                top = max(top, p[j, t])
            total = np.float32(0.0)
            for t in range(n):
                e = np.exp(p[j, t] - top)
                p[j, t] = e
                total += e
            inv = np.float32(1.0) / total
            for t in range(n):
                p[j, t] *= inv
        for t in range(n):
            blk = tables[r, t // bs]
            s = t - (t // bs) * bs
            for j in range(g):
                w = p[j, t]
                for d in range(dim):
                    acc_v[j, d] += w * v[blk, kh, s, d]
        for j in range(g):
            for d in range(dim):
                out[r, kh * g + j, d] = acc_v[j, d]


RowsKernel = Callable[
    [np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, np.ndarray], None
]


def c_kernel_fits(num_heads: int, num_kv_heads: int, dim: int) -> bool:
    return dim % 16 == 0 and dim <= 256 and num_heads // num_kv_heads <= 16


def kernel_row_limit(num_heads: int, num_kv_heads: int, dim: int) -> int | None:
    """The longest chunk the compiled kernel takes: every one where the C kernel serves
    these heads; with the Numba fallback (per-key scalar loops), BLAS is faster beyond
    SMALL_ROWS."""
    fits = native.library() is not None and c_kernel_fits(num_heads, num_kv_heads, dim)
    return None if fits else SMALL_ROWS


@functools.cache
def _paged_rows_kernel() -> RowsKernel:
    """_paged_rows's signature, in C where the engine's C kernels build: the function of
    KERNEL_KV_DTYPES for the pool's dtype (the Numba fallback reads a float16 or q8_0 layer
    widened to float32 first: a copy per call)."""
    lib = native.library()
    if lib is None:
        return _widened
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fns = {}
    for dtype, name in KERNEL_KV_DTYPES.items():
        fn = getattr(lib, name)
        fn.argtypes = [p, p, p, p, i64, p, i64, i64, i64, i64, ctypes.c_float, p, ctypes.c_int]
        fn.restype = i64  # 0, or the scratch bytes refused
        fns[dtype] = fn

    def run(q: np.ndarray, k: np.ndarray, v: np.ndarray, tables: np.ndarray,
            lengths: np.ndarray, scale: float, out: np.ndarray) -> None:  # fmt: skip
        num_rows, num_heads, dim = q.shape
        fn = fns.get(k.dtype)
        if fn is None or not c_kernel_fits(num_heads, k.shape[1], dim):
            _widened(q, k, v, tables, lengths, scale, out)
            return
        assert k.flags.c_contiguous and v.flags.c_contiguous and tables.dtype == np.int32
        assert v.dtype == k.dtype
        refused = fn(
            address(q),
            address(k),
            address(v),
            address(tables),
            tables.shape[1],
            address(lengths),
            num_rows,
            num_heads,
            k.shape[1],
            dim,
            scale,
            address(out),
            get_num_threads(),
        )
        if refused:
            raise native.scratch_refused("wf_paged_rows", refused, f"a {num_rows}-row attention")

    return run


def _widened(q: Array, k: Array, v: Array, *tables_lengths_scale_out: Any) -> None:
    """_paged_rows on a layer of any KV dtype (float32: as it is)."""
    _paged_rows(q, widened(k), widened(v), *tables_lengths_scale_out)


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    """Where a step's rows attend, worked out once for all layers.

    kernel_rows: the rows computed by the compiled kernel, with their block tables and
    key counts; chunks: (first row, rows, start position, block ids) of each chunk that
    gathers and uses BLAS."""

    kernel_rows: np.ndarray  # [R] int64
    tables: Array  # [R, max_blocks] int32 (on the GPU for its kernel: see `to`)
    lengths: Array  # [R] int32
    chunks: tuple[tuple[int, int, int, np.ndarray], ...]

    def to(self, xp: ModuleType) -> AttentionPlan:
        """The plan with the kernel's tables and lengths in `xp`'s memory (one copy a step,
        not one a layer)."""
        return replace(self, tables=xp.asarray(self.tables), lengths=xp.asarray(self.lengths))

    @classmethod
    def build(
        cls, segments: list[tuple[list[int], int, int]], small_rows: int | None, compiled: bool
    ) -> AttentionPlan:
        """segments: (block ids, start position, length) in row order; chunks longer than
        `small_rows` (None: no limit), or every segment when there is no compiled kernel,
        gather."""
        rows: list[int] = []
        lengths: list[int] = []
        kernel_segments: list[tuple[list[int], int]] = []  # block ids, rows
        chunks = []
        row = 0
        for blocks, start, n in segments:
            if compiled and (small_rows is None or n <= small_rows):
                rows += range(row, row + n)
                lengths += range(start + 1, start + n + 1)
                kernel_segments.append((blocks, n))
            else:
                chunks.append((row, n, start, np.asarray(blocks, dtype=np.int64)))
            row += n
        width = max((len(b) for b, _ in kernel_segments), default=0)
        tables = np.zeros((len(rows), width), dtype=np.int32)
        i = 0
        for blocks, n in kernel_segments:  # a segment's rows share its table
            tables[i : i + n, : len(blocks)] = blocks
            i += n
        return cls(
            np.asarray(rows, dtype=np.int64), tables, np.asarray(lengths, dtype=np.int32),
            tuple(chunks),
        )  # fmt: skip


def softmax_inplace(scores: Array, xp: ModuleType) -> Array:
    scores -= scores.max(axis=-1, keepdims=True)
    xp.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


QUERY_BLOCK = 32  # a long chunk's queries attend this many at a time (see attend_dense)


def attend_dense(q: Array, keys: Array, values: Array, start: int, xp: ModuleType) -> Array:
    """Causal attention of one chunk's queries [n, H, D] (at positions start...) over its
    sequence's keys and values [Hkv, T, D], T = start + n; returns [n, H * D].

    The queries go QUERY_BLOCK at a time, each block over the keys up to its last position
    only: about half the work of one [n, T] product for a chunk from an empty cache, and a
    block's scores stay in cache through the softmax's passes."""
    n, num_heads, d = q.shape
    hkv = keys.shape[0]
    g = num_heads // hkv
    qg = q.reshape(n, hkv, g, d).transpose(1, 0, 2, 3)  # [Hkv, n, G, D]
    out = xp.empty((hkv, n, g, d), dtype=q.dtype)
    for q0 in range(0, n, QUERY_BLOCK):
        m = min(QUERY_BLOCK, n - q0)
        t = start + q0 + m  # the keys the block's last query sees
        scores = qg[:, q0 : q0 + m].reshape(hkv, m * g, d) @ keys[:, :t].transpose(0, 2, 1)
        scores *= d**-0.5  # [Hkv, m*G, t]
        if m > 1:
            # query i of the block sees keys up to t - m + i: only the last m keys differ
            future = xp.arange(m)[None, :] > xp.arange(m)[:, None]  # [m, m]
            bias = xp.where(future, -xp.inf, 0.0).astype(scores.dtype)
            scores.reshape(hkv, m, g, t)[..., t - m :] += bias[None, :, None, :]
        probs = softmax_inplace(scores, xp)
        out[:, q0 : q0 + m] = (probs @ values[:, :t]).reshape(hkv, m, g, d)
    return out.transpose(1, 0, 2, 3).reshape(n, num_heads * d)


def gather(pool_layer: Array, blocks: Array, num_keys: int, dtype: Any) -> Array:
    """A sequence's keys (or values) of one layer as [Hkv, num_keys, D] in `dtype` (a copy;
    q8_0 blocks dequantized)."""
    held = pool_layer[blocks]  # [nb, Hkv, B, D]
    held = dequantize(held) if held.dtype == Q8_0 else held
    nb, hkv, bs, d = held.shape
    return (
        held.transpose(1, 0, 2, 3).reshape(hkv, nb * bs, d)[:, :num_keys].astype(dtype, copy=False)
    )


def paged_attention(
    q: Array, k_layer: Array, v_layer: Array, plan: AttentionPlan, xp: ModuleType
) -> Array:
    """Every row's attention over its sequence's keys in the pool (this step's keys and
    values written already); q: [N, H, D], k_layer, v_layer: [num_blocks, Hkv, B, D].
    Returns [N, H * D]."""
    n_tok, num_heads, d = q.shape
    rows = plan.kernel_rows
    if len(rows) == n_tok > 0 and xp is not np:  # CuPy: every row in one launch
        got = gpu_ops.paged_attention(q, k_layer, v_layer, plan.tables, plan.lengths, d**-0.5)
        return got.reshape(n_tok, num_heads * d)
    out = xp.empty((n_tok, num_heads, d), dtype=q.dtype)
    if len(rows) == n_tok > 0 and q.dtype == np.float32:  # decode: no gather, no scatter
        qc = np.ascontiguousarray(q)
        _paged_rows_kernel()(qc, k_layer, v_layer, plan.tables, plan.lengths, d**-0.5, out)
    elif len(rows):  # the kernel's rows (in float32 where the compute dtype is float16)
        got = np.empty((len(rows), num_heads, d), dtype=np.float32)
        qr = np.ascontiguousarray(q[rows], dtype=np.float32)
        _paged_rows_kernel()(qr, k_layer, v_layer, plan.tables, plan.lengths, d**-0.5, got)
        out[rows] = got
    for row, n, start, blocks in plan.chunks:
        b = xp.asarray(blocks)
        keys, values = (gather(a, b, start + n, q.dtype) for a in (k_layer, v_layer))
        out[row : row + n] = attend_dense(q[row : row + n], keys, values, start, xp).reshape(
            n, num_heads, d
        )
    return out.reshape(n_tok, num_heads * d)
