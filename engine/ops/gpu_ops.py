"""A layer's steps on the GPU in float32, one kernel launch each (engine/ops/csrc/*.cu, compiled
by CuPy's NVRTC on first use and cached by CuPy): RMS norm (of rows, or of each head's q
and k), rope with the step's keys and values written into the pool, SiLU(gate) * up and
the paged attention of every row of a step. Each CuPy expression they replace is 5-12
launches, and a decode step is bound by launches, not by arithmetic. float16 keeps CuPy
expressions.

Shapes: N rows, H heads, Hkv KV heads, D head_dim, B block size.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import Any

import numpy as np

CSRC = Path(__file__).parent / "csrc"
THREADS = 256
NORM_THREADS = 256  # as in elementwise.cu
ATTENTION_SPLIT = 8  # as in attention.cu: warps per (row, head), each on its share of keys
OPTIONS = ("--std=c++17",)  # NVRTC's, beside the device's -arch that CuPy adds
# the kernels that write and read a pool of each KV dtype (float32 queries and arithmetic)
ROPE_KERNELS = {
    np.dtype(np.float32): "wf_rope_into_pool",
    np.dtype(np.float16): "wf_rope_into_pool_f16",
}
ATTENTION_KERNELS = {  # by the pool array's dtype: a q8_0 pool holds its bytes on CUDA
    np.dtype(np.float32): "wf_paged_attention",
    np.dtype(np.float16): "wf_paged_attention_f16",
    np.dtype(np.uint8): "wf_paged_attention_q8",
}
Array = Any  # cupy.ndarray


@functools.cache
def compiled(source: str) -> Any:
    """The CuPy RawModule of engine/ops/csrc/`source`."""
    cupy = importlib.import_module("cupy")
    return cupy.RawModule(code=(CSRC / source).read_text(), options=OPTIONS)


def gpu_float32(*arrays: Array) -> bool:
    """Every array is a CuPy float32 one (the kernels here take them)."""
    return all(type(a).__module__.startswith("cupy") and a.dtype == np.float32 for a in arrays)


def rope_writes(pool: Array) -> bool:
    """Whether the rope kernel writes into this pool array (CuPy, float32 or float16; a
    q8_0 pool's keys are quantized by KVPool.write_layer)."""
    return type(pool).__module__.startswith("cupy") and pool.dtype in ROPE_KERNELS


def _blocks(n: int) -> tuple[int]:
    return (-(-n // THREADS),)


def rms_norm(x: Array, weight: Array, eps: float) -> Array:
    # x: [N, dim]
    cupy = importlib.import_module("cupy")
    x = cupy.ascontiguousarray(x)
    out = cupy.empty_like(x)
    if x.shape[0]:
        compiled("elementwise.cu").get_function("wf_rms_norm")(
            (x.shape[0],),
            (NORM_THREADS,),
            (x, cupy.ascontiguousarray(weight), np.float32(eps), np.int32(x.shape[1]), out),
        )
    return out


def head_rms_norm(
    x: Array, col0: int, heads: int, head_dim: int, weight: Array, eps: float
) -> None:
    """In place: each head's run of x [N, C] (columns col0 .. col0 + heads * D, float32,
    contiguous) RMS-normed with weight [D]; one launch, a block per (row, head)."""
    cupy = importlib.import_module("cupy")
    blocks = x.shape[0] * heads
    if blocks:
        compiled("elementwise.cu").get_function("wf_head_rms_norm")(
            (blocks,),
            (NORM_THREADS,),
            (
                x,
                np.int64(x.shape[1]),
                np.int64(col0),
                np.int32(heads),
                np.int32(head_dim),
                cupy.ascontiguousarray(weight),
                np.float32(eps),
            ),
        )


def rope_into_pool(qkv: Array, heads: int, kv_heads: int, head_dim: int,
                   tables: tuple[Array, Array], positions: Array, rows: Array, shift: int,
                   k_pool: Array, v_pool: Array) -> Array:  # fmt: skip
    """A step's qkv [N, (H + 2 Hkv) D] in one launch: q rotated, returned [N, H, D]; k
    rotated and v written into the pools (float32 or float16, contiguous) at `rows`
    [N * Hkv] + shift of the pool seen as [positions, D] (KVPool.write_layer's places)."""
    cupy = importlib.import_module("cupy")
    qkv = cupy.ascontiguousarray(qkv)
    n = qkv.shape[0]
    q = cupy.empty((n, heads, head_dim), dtype=cupy.float32)
    threads = n * (heads + 2 * kv_heads) * (head_dim // 2)
    if threads:
        cos_t, sin_t = tables
        compiled("elementwise.cu").get_function(ROPE_KERNELS[k_pool.dtype])(
            _blocks(threads),
            (THREADS,),
            (
                qkv,
                np.int64(n),
                np.int32(heads),
                np.int32(kv_heads),
                np.int32(head_dim),
                cos_t,
                sin_t,
                cupy.ascontiguousarray(positions, cupy.int64),
                cupy.ascontiguousarray(rows, cupy.int64),
                np.int64(shift),
                q,
                k_pool,
                v_pool,
            ),
        )
    return q


def silu_mul(gate_up: Array, ffn_dim: int) -> Array:
    # gate_up: [N, 2 * ffn] -> [N, ffn]
    cupy = importlib.import_module("cupy")
    gate_up = cupy.ascontiguousarray(gate_up)
    out = cupy.empty((gate_up.shape[0], ffn_dim), dtype=cupy.float32)
    if out.size:
        compiled("elementwise.cu").get_function("wf_silu_mul")(
            _blocks(out.size),
            (THREADS,),
            (gate_up, np.int64(gate_up.shape[0]), np.int32(ffn_dim), out),
        )
    return out


def attention_fits(head_dim: int) -> bool:
    """The attention kernel holds D / 32 dims per lane, at most 4."""
    return head_dim % 32 == 0 and head_dim <= 128


def paged_attention(
    q: Array,
    k_layer: Array,
    v_layer: Array,
    tables: Array,
    lengths: Array,
    scale: float,
    window: int = 0,
    sinks: Array | None = None,
) -> Array:
    """Every row's attention over its keys: q [N, H, D]; k_layer, v_layer [num_blocks, Hkv,
    B, D] (float32 or float16; a q8_0 pool's bytes, [num_blocks, Hkv, B, D / 32 * 34]
    uint8); tables [N, width] int32 block ids; lengths [N] int32 keys seen. With a window,
    each row sees its last `window` keys only; with sinks [H], each head's logit joins its
    softmax's denominator (gpt-oss). -> [N, H, D] in q's dtype (float16 queries are
    widened, and the output rounded back)."""
    cupy = importlib.import_module("cupy")
    asked = q.dtype
    q = cupy.ascontiguousarray(q, dtype=cupy.float32)
    n, heads, d = q.shape
    _, hkv, bs, _ = k_layer.shape
    out = cupy.empty_like(q)
    tasks = n * heads
    # without sinks the kernel never reads its pointer: any device array will do
    head_sinks = q if sinks is None else cupy.asarray(sinks, dtype=cupy.float32)  # [H]
    if tasks:
        compiled("attention.cu").get_function(ATTENTION_KERNELS[k_layer.dtype])(
            (tasks,),
            (32 * ATTENTION_SPLIT,),
            (
                q,
                k_layer,
                v_layer,
                tables,
                np.int32(tables.shape[1]),
                lengths,
                np.float32(scale),
                out,
                np.int32(heads),
                np.int32(hkv),
                np.int32(d),
                np.int32(bs),
                np.int32(k_layer.shape[-1]),  # a row's elements
                np.int32(window),
                head_sinks,
                np.int32(sinks is not None),
            ),
        )
    return out if asked == np.float32 else out.astype(asked)
