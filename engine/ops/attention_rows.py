"""The attention of single query rows over the paged KV pool, each row a task of its own
(engine/ops/csrc/attention.c, bound here; the Numba kernel where no C compiler is): a row
is computed by the same loop whatever else is in the call, so its bits are its own. A row
may see only its last `window` keys, and a sink logit per query head may join each
softmax's denominator (gpt-oss).

Shapes: R query rows, H heads, Hkv KV heads, G = H / Hkv, D head_dim, B block size.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import get_num_threads, njit, prange

from engine.kv_files.kv_dtypes import Q8_0, widened
from engine.ops import native
from engine.ops.chunks import SMALL_ROWS, kernel_attention_rows
from engine.ops.native import address

Array = Any
KERNEL_KV_DTYPES = {
    np.dtype(np.float32): "wf_paged_rows_windowed",
    np.dtype(np.float16): "wf_paged_rows_windowed_f16",
    Q8_0: "wf_paged_rows_windowed_q8",
}
NO_SINKS = np.zeros(0, dtype=np.float32)  # what the kernels take for "no sinks"


def kernel_reads(kv_dtype: np.dtype[Any]) -> bool:
    """Whether the rows kernel reads a pool of this dtype in place: float32 always (C or
    Numba), float16 and q8_0 where the C kernels build (Numba's would widen the layer each
    call, so the gather path serves)."""
    return kv_dtype == np.float32 or (kv_dtype in KERNEL_KV_DTYPES and native.library() is not None)


@njit(fastmath=True, cache=True, nogil=True)
def _softmax_span(
    p: np.ndarray, lo: int, n: int, has_sink: bool, sink: float
) -> None:  # pragma: no cover
    """p[lo:n] becomes its softmax, with a sink logit joining the denominator where
    has_sink (no infinities: fastmath assumes none)."""
    top = max(p[lo], sink) if has_sink else p[lo]
    for t in range(lo + 1, n):
        top = max(top, p[t])
    total = np.float32(0.0)
    for t in range(lo, n):
        e = np.exp(p[t] - top)
        p[t] = e
        total += e
    if has_sink:
        total += np.exp(sink - top)
    inv = np.float32(1.0) / total
    for t in range(lo, n):
        p[t] *= inv


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _paged_rows_limited(
    q: np.ndarray,  # [R, H, D]
    k: np.ndarray,  # [num_blocks, Hkv, B, D] (one layer)
    v: np.ndarray,
    tables: np.ndarray,  # [R, max_blocks] int32: the block ids of each row's sequence
    lengths: np.ndarray,  # [R] int32: how many keys each row sees (its position + 1)
    scale: float,
    out: np.ndarray,  # [R, H, D]
    window: int,  # each row sees its last `window` keys only (0: all)
    sinks: np.ndarray,  # [H] float32 logits joining each softmax's denominator, or empty
) -> None:  # pragma: no cover
    num_rows, num_heads, dim = q.shape
    hkv, bs = k.shape[1], k.shape[2]
    g = num_heads // hkv
    for task in prange(num_rows * hkv):
        r = task // hkv
        kh = task - r * hkv
        n = lengths[r]
        lo = n - window if 0 < window < n else 0
        p = np.empty((g, n), dtype=np.float32)  # keys lo .. n - 1 used
        for t in range(lo, n):
            blk = tables[r, t // bs]
            s = t - (t // bs) * bs
            for j in range(g):
                acc = np.float32(0.0)
                for d in range(dim):
                    acc += q[r, kh * g + j, d] * k[blk, kh, s, d]
                p[j, t] = acc * scale
        acc_v = np.zeros((g, dim), dtype=np.float32)
        for j in range(g):
            has_sink = len(sinks) > 0
            _softmax_span(p[j], lo, n, has_sink, sinks[kh * g + j] if has_sink else 0.0)
        for t in range(lo, n):
            blk = tables[r, t // bs]
            s = t - (t // bs) * bs
            for j in range(g):
                w = p[j, t]
                for d in range(dim):
                    acc_v[j, d] += w * v[blk, kh, s, d]
        for j in range(g):
            for d in range(dim):
                out[r, kh * g + j, d] = acc_v[j, d]


def paged_rows(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    tables: np.ndarray,
    lengths: np.ndarray,
    scale: float,
    out: np.ndarray,
    window: int = 0,
    sinks: np.ndarray = NO_SINKS,
) -> None:
    """The Numba kernel: every key (window 0) and no sinks unless asked."""
    _paged_rows_limited(q, k, v, tables, lengths, scale, out, window, sinks)


# (q, k, v, tables, lengths, scale, out[, window, sinks]): paged_rows's arguments
RowsKernel = Callable[..., None]


def c_kernel_fits(num_heads: int, num_kv_heads: int, dim: int) -> bool:
    return dim % 16 == 0 and dim <= 256 and num_heads // num_kv_heads <= 16


def kernel_row_limit(
    num_heads: int, num_kv_heads: int, dim: int, in_place: bool = False
) -> int | None:
    """The longest chunk the compiled kernel takes where the C kernel serves these heads:
    every one for a model whose matrices are all read in place (`in_place`: an MoE model's,
    whose products take every row, so that a row's bits are its own whatever chunk it came
    in), else as long as the build's attention takes (engine/ops/chunks.py: every one on
    AVX-512 and AVX2, the products' bound on NEON and plain C). Longer chunks, and those
    beyond SMALL_ROWS with the Numba fallback's per-key scalar loops, gather their keys and
    use BLAS."""
    if native.library() is None or not c_kernel_fits(num_heads, num_kv_heads, dim):
        return SMALL_ROWS
    return None if in_place else kernel_attention_rows()


def _bound(lib: ctypes.CDLL, name: str) -> Any:
    """The library's function `name` (wf_paged_rows_windowed and its twins), its argument
    types set."""
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn = getattr(lib, name)
    fn.argtypes = [p, p, p, p, i64, p, i64, i64, i64, i64, ctypes.c_float, p, ctypes.c_int]
    fn.argtypes += [i64, p]  # the window, the sinks
    fn.restype = i64  # 0, or the scratch bytes refused
    return fn


@functools.cache
def rows_kernel() -> RowsKernel:
    """paged_rows's signature, in C where the engine's C kernels build: the function of
    KERNEL_KV_DTYPES for the pool's dtype (the Numba fallback reads a float16 or q8_0 layer
    widened to float32 first: a copy per call)."""
    lib = native.library()
    if lib is None:
        return _widened
    fns = {dtype: _bound(lib, name) for dtype, name in KERNEL_KV_DTYPES.items()}

    def run(
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        tables: np.ndarray,
        lengths: np.ndarray,
        scale: float,
        out: np.ndarray,
        window: int = 0,
        sinks: np.ndarray = NO_SINKS,
    ) -> None:
        num_rows, num_heads, dim = q.shape
        fn = fns.get(k.dtype)
        if fn is None or not c_kernel_fits(num_heads, k.shape[1], dim):
            _widened(q, k, v, tables, lengths, scale, out, window, sinks)
            return
        assert sinks.dtype == np.float32 and len(sinks) in (0, num_heads)
        assert k.flags.c_contiguous and v.flags.c_contiguous and tables.dtype == np.int32
        assert v.dtype == k.dtype
        arrays = (address(q), address(k), address(v), address(tables), tables.shape[1])
        shape = (address(lengths), num_rows, num_heads, k.shape[1], dim, scale)
        at_sinks = address(sinks) if len(sinks) else None
        refused = fn(*arrays, *shape, address(out), get_num_threads(), window, at_sinks)
        if refused:
            raise native.scratch_refused("wf_paged_rows", refused, f"a {num_rows}-row attention")

    return run


def _widened(q: Array, k: Array, v: Array, *rest: Any) -> None:
    """paged_rows on a layer of any KV dtype (float32: as it is)."""
    paged_rows(q, widened(k), widened(v), *rest)
