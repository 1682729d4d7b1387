"""A layer's elementwise steps: RMS norm (of rows, or of each head's q and k), rope,
SiLU(gate) * up, the residual adds; and a step's keys or values into the KV pool. On NumPy
float32 each is one C call (engine/ops/csrc/elementwise.c, a long chunk's rows split over
the kernels' threads) where the C kernels build, on CuPy float32 one launch
(engine/ops/gpu_ops.py; rope there is forward.py's, with the pool's writes); otherwise NumPy
(and CuPy) expressions. Shapes: N rows, D head_dim."""

from __future__ import annotations

import ctypes
import functools
from types import ModuleType
from typing import Any

import numpy as np
from numba import get_num_threads

from engine.kv_files.kv_dtypes import KINDS
from engine.ops import gpu_ops, native
from engine.ops.native import address

Array = Any


@functools.cache
def _lib() -> ctypes.CDLL | None:
    lib = native.library()
    if lib is None:
        return None
    p, i, i64, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    lib.wf_rms_norm.argtypes = [p, p, f, i64, i64, p, i]
    lib.wf_head_rms_norm.argtypes = [p, i64, i64, i64, i64, i64, p, f, i]
    lib.wf_rope.argtypes = [p, i64, i64, i64, i64, i64, p, p, p, p, i]
    lib.wf_silu_mul.argtypes = [p, i64, i64, p, i]
    lib.wf_add.argtypes = [p, p, i64, i64, p, i]
    lib.wf_put_kv_rows.argtypes = [p, i, p, p, i64, i64, i64, i64, i]
    for fn in (lib.wf_rms_norm, lib.wf_head_rms_norm, lib.wf_rope, lib.wf_silu_mul):
        fn.restype = None
    lib.wf_add.restype = lib.wf_put_kv_rows.restype = None
    return lib


def _compiled(*arrays: Array, multiple_of: int) -> ctypes.CDLL | None:
    """The library, when every array is a C-contiguous NumPy float32 one and the sizes
    suit the vector loops."""
    if any(not (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous)
           for a in arrays) or multiple_of % 16:  # fmt: skip
        return None
    return _lib()


def rms_norm(x: Array, weight: Array, eps: float, xp: ModuleType) -> Array:
    # x: [N, dim]
    if gpu_ops.gpu_float32(x, weight):
        return gpu_ops.rms_norm(x, weight, eps)
    lib = _compiled(x, weight, multiple_of=x.shape[-1])
    if lib is None:
        # the squares in float32 at least: a float16 activation past 256 squares to inf
        wide = x.astype(xp.float32) if x.dtype == xp.float16 else x
        scale = 1.0 / xp.sqrt(xp.mean(wide * wide, axis=-1, keepdims=True) + eps)
        return (x * scale.astype(x.dtype)) * weight
    out, (n, dim) = np.empty_like(x), x.shape
    lib.wf_rms_norm(address(x), address(weight), eps, n, dim, address(out), get_num_threads())
    return out


def head_rms_norm(
    qkv: Array, col0: int, heads: int, head_dim: int, weight: Array, eps: float, xp: ModuleType
) -> None:
    """In place: columns col0 .. col0 + heads * D of qkv [N, C] RMS-normed head by head
    (D values each) with weight [D], as rms_norm does a row."""
    if gpu_ops.gpu_float32(qkv, weight) and qkv.flags.c_contiguous:
        gpu_ops.head_rms_norm(qkv, col0, heads, head_dim, weight, eps)
        return
    lib = _compiled(qkv, weight, multiple_of=head_dim)
    if lib is None:
        n, cols = qkv.shape[0], slice(col0, col0 + heads * head_dim)
        runs = qkv[:, cols].reshape(n * heads, head_dim)
        qkv[:, cols] = rms_norm(runs, weight, eps, xp).reshape(n, heads * head_dim)
        return
    n, cols = qkv.shape
    lib.wf_head_rms_norm(
        address(qkv), cols, col0, n, heads, head_dim, address(weight), eps, get_num_threads()
    )


def rope(
    qkv: Array, col0: int, heads: int, head_dim: int, tables: tuple[Array, Array],
    positions: Array, xp: ModuleType,
) -> Array:  # fmt: skip
    """[N, heads, D]: columns col0 .. col0 + heads * D of qkv [N, C] rotated at their
    positions; tables: cos and sin [context, D/2]."""
    cos_t, sin_t = tables
    n = qkv.shape[0]
    lib = _compiled(qkv, cos_t, sin_t, multiple_of=head_dim // 2)
    if lib is None or positions.dtype != np.int64:
        x = qkv[:, col0 : col0 + heads * head_dim].reshape(n, heads, head_dim)
        cos, sin = cos_t[positions][:, None, :], sin_t[positions][:, None, :]
        half = head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return xp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    pos = np.ascontiguousarray(positions)
    out = np.empty((n, heads, head_dim), dtype=np.float32)
    lib.wf_rope(
        address(qkv),
        qkv.shape[1],
        col0,
        n,
        heads,
        head_dim,
        address(cos_t),
        address(sin_t),
        address(pos),
        address(out),
        get_num_threads(),
    )
    return out


def silu_mul(gate_up: Array, ffn_dim: int, xp: ModuleType) -> Array:
    # gate_up: [N, 2 * ffn] -> [N, ffn]
    if gpu_ops.gpu_float32(gate_up):
        return gpu_ops.silu_mul(gate_up, ffn_dim)
    lib = _compiled(gate_up, multiple_of=ffn_dim)
    if lib is None:
        gate, up = gate_up[:, :ffn_dim], gate_up[:, ffn_dim:]
        # float16: the sigmoid in float32 (exp(-gate) overflows float16 below gate = -11)
        wide = gate.astype(xp.float32) if gate.dtype == xp.float16 else gate
        act = (wide / (1.0 + xp.exp(-wide))).astype(gate.dtype, copy=False)
        act *= up
        return act
    out = np.empty((gate_up.shape[0], ffn_dim), dtype=np.float32)
    lib.wf_silu_mul(address(gate_up), gate_up.shape[0], ffn_dim, address(out), get_num_threads())
    return out


def add(x: Array, y: Array, xp: ModuleType) -> Array:
    """x + y (the residual stream's adds), in one C call on NumPy float32 where it builds:
    its rows split over the kernels' threads for a long chunk."""
    lib = _compiled(x, y, multiple_of=16)
    if lib is None or x.shape != y.shape or x.ndim != 2:
        return x + y
    out = np.empty_like(x)
    lib.wf_add(address(x), address(y), x.shape[0], x.shape[1], address(out), get_num_threads())
    return out


def put_kv_rows(pools: tuple[Array, Array], rows: Array, srcs: tuple[Array, Array]) -> bool:
    """Keys and values, srcs [N, heads, D] (float32, each head's D values contiguous), into
    the flat rows `rows` [N * heads] (int64) of NumPy pools of float32, float16 or q8_0
    blocks, rounded or quantized as NumPy does it, in one C call each: whether they were
    (neither is where the C kernels did not build, or an array does not suit)."""
    lib = _lib()
    if lib is None or not (isinstance(rows, np.ndarray) and _row_ids(rows)):
        return False
    if not all(_suits(pool, src) for pool, src in zip(pools, srcs, strict=True)):
        return False
    for pool, src in zip(pools, srcs, strict=True):
        n, heads, d = src.shape
        kind, stride = KINDS.index(pool.dtype), src.strides[0] // 4
        threads = get_num_threads()
        lib.wf_put_kv_rows(
            address(pool), kind, address(rows), address(src), n, heads, stride, d, threads
        )
    return True


def _row_ids(rows: np.ndarray) -> bool:
    return rows.dtype == np.int64 and rows.flags.c_contiguous


def _suits(pool: Array, src: Array) -> bool:
    """A contiguous NumPy pool of a kind the C put takes, and float32 rows of D values (a
    multiple of 32) each contiguous."""
    if not (isinstance(pool, np.ndarray) and pool.flags.c_contiguous and pool.dtype in KINDS):
        return False
    if not (isinstance(src, np.ndarray) and src.dtype == np.float32 and src.ndim == 3):
        return False
    d = src.shape[2]
    return src.strides[1:] == (4 * d, 4) and d % 32 == 0
