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
of a step is one launch of engine/ops/csrc/attention.cu per layer (gpu_ops.paged_attention),
over a float32 or a float16 pool (float16 compute's queries widened to float32 for it, its
output rounded back).

Shapes: R query rows, H heads, Hkv KV heads, G = H / Hkv, D head_dim, B block size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import numpy as np

from engine.kv_files.kv_dtypes import Q8_0, dequantize
from engine.ops import gpu_ops
from engine.ops.attention_rows import NO_SINKS, rows_kernel

Array = Any


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
        """segments: (block ids, start position, length) in row order (-1: a block that
        left the window, never read); chunks longer than
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
        # a windowed table's released blocks (-1) are never read: any block id will do
        np.maximum(tables, 0, out=tables)
        chunks = [(r, n, s, np.maximum(b, 0)) for r, n, s, b in chunks]
        return cls(
            np.asarray(rows, dtype=np.int64), tables, np.asarray(lengths, dtype=np.int32),
            tuple(chunks),
        )  # fmt: skip


def softmax_inplace(scores: Array, xp: ModuleType, sinks: Array | None = None) -> Array:
    """The softmax of each row of scores [..., T]; with sinks (broadcast to [..., 1]), each
    row's sink joins its maximum and denominator as one more key."""
    top = scores.max(axis=-1, keepdims=True)
    if sinks is not None:
        top = xp.maximum(top, sinks)
    scores -= top
    xp.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total += xp.exp(sinks - top)
    scores /= total
    return scores


QUERY_BLOCK = 32  # a long chunk's queries attend this many at a time (see attend_dense)


def attend_dense(
    q: Array,
    keys: Array,
    values: Array,
    start: int,
    xp: ModuleType,
    window: int = 0,
    sinks: Array | None = None,
    key0: int = 0,
) -> Array:
    """Causal attention of one chunk's queries [n, H, D] (at positions start...) over its
    sequence's keys and values [Hkv, T, D] of positions key0 .. start + n - 1 (key0 > 0
    only with a window: the first any query sees); returns [n, H * D]. With a window, each
    query sees its last `window` keys only; with sinks [H], each head's joins its
    softmax's denominator.

    The queries go QUERY_BLOCK at a time, each block over the keys up to its last position
    only: about half the work of one [n, T] product for a chunk from an empty cache, and a
    block's scores stay in cache through the softmax's passes."""
    n, num_heads, d = q.shape
    hkv = keys.shape[0]
    g = num_heads // hkv
    qg = q.reshape(n, hkv, g, d).transpose(1, 0, 2, 3)  # [Hkv, n, G, D]
    out = xp.empty((hkv, n, g, d), dtype=q.dtype)
    head_sinks = None if sinks is None else sinks.reshape(hkv, 1, g, 1)
    for q0 in range(0, n, QUERY_BLOCK):
        m = min(QUERY_BLOCK, n - q0)
        t = start + q0 + m  # the keys the block's last query sees: positions key0 .. t - 1
        tk = t - key0
        scores = qg[:, q0 : q0 + m].reshape(hkv, m * g, d) @ keys[:, :tk].transpose(0, 2, 1)
        scores *= d**-0.5  # [Hkv, m*G, tk]
        if window:  # query i of the block sees keys (t - m + i - window, t - m + i]
            pos = xp.arange(t - m, t)[:, None]
            gap = pos - xp.arange(key0, t)[None, :]  # [m, tk]
            bias = xp.where((gap < 0) | (gap >= window), -xp.inf, 0.0).astype(scores.dtype)
            scores.reshape(hkv, m, g, tk)[...] += bias[None, :, None, :]
        elif m > 1:
            # query i of the block sees keys up to t - m + i: only the last m keys differ
            future = xp.arange(m)[None, :] > xp.arange(m)[:, None]  # [m, m]
            bias = xp.where(future, -xp.inf, 0.0).astype(scores.dtype)
            scores.reshape(hkv, m, g, t)[..., t - m :] += bias[None, :, None, :]
        block_sinks = None
        if head_sinks is not None:
            block_sinks = xp.broadcast_to(head_sinks, (hkv, m, g, 1)).reshape(hkv, m * g, 1)
        probs = softmax_inplace(scores, xp, block_sinks)
        out[:, q0 : q0 + m] = (probs @ values[:, :tk]).reshape(hkv, m, g, d)
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
    q: Array,
    k_layer: Array,
    v_layer: Array,
    plan: AttentionPlan,
    xp: ModuleType,
    window: int = 0,
    sinks: Array | None = None,
) -> Array:
    """Every row's attention over its sequence's keys in the pool (this step's keys and
    values written already); q: [N, H, D], k_layer, v_layer: [num_blocks, Hkv, B, D].
    With a window, each row sees its last `window` keys only; with sinks [H] float32, each
    head's learned logit joins its softmax's denominator (gpt-oss). Returns [N, H * D]."""
    n_tok, num_heads, d = q.shape
    rows = plan.kernel_rows
    if len(rows) == n_tok > 0 and xp is not np:  # CuPy: every row in one launch
        tables, lengths = plan.tables, plan.lengths
        got = gpu_ops.paged_attention(q, k_layer, v_layer, tables, lengths, d**-0.5, window, sinks)
        return got.reshape(n_tok, num_heads * d)
    out = xp.empty((n_tok, num_heads, d), dtype=q.dtype)
    host_sinks = NO_SINKS if sinks is None else np.ascontiguousarray(sinks, dtype=np.float32)
    limits = (window, host_sinks)
    if len(rows) == n_tok > 0 and q.dtype == np.float32:  # decode: no gather, no scatter
        qc = np.ascontiguousarray(q)
        rows_kernel()(qc, k_layer, v_layer, plan.tables, plan.lengths, d**-0.5, out, *limits)
    elif len(rows):  # the kernel's rows (in float32 where the compute dtype is float16)
        got = np.empty((len(rows), num_heads, d), dtype=np.float32)
        qr = np.ascontiguousarray(q[rows], dtype=np.float32)
        rows_kernel()(qr, k_layer, v_layer, plan.tables, plan.lengths, d**-0.5, got, *limits)
        out[rows] = got
    size = k_layer.shape[2]
    for row, n, start, blocks in plan.chunks:
        skip = max(0, start + 1 - window) // size if window else 0  # blocks none sees
        b = xp.asarray(blocks[skip:])
        keys, values = (gather(a, b, start + n - skip * size, q.dtype) for a in (k_layer, v_layer))
        got = attend_dense(q[row : row + n], keys, values, start, xp, window, sinks, skip * size)
        out[row : row + n] = got.reshape(n, num_heads, d)
    return out.reshape(n_tok, num_heads * d)
