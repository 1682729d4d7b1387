"""A step's decoder layers in one C call (engine/ops/csrc/layers.c) where every part of them
runs in the C kernels: quantized weights, NumPy float32, every row in the kernels. The same
kernels in the same order on the same values as the family's layer run op by op
(engine/forward.py), so the same bits, without the ~14 Python calls per layer between them
(about 2 ms of a 10 ms single-row step on 2 cores, bench/RESULTS.md). It runs the layers of
the families that say so (engine/models): q, k, v biases, per-head q/k norms, an output
bias, sinks and a sliding window where the weights have them."""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.kv_files.kv_dtypes import KINDS
from engine.ops import native
from engine.ops.attention_rows import KERNEL_KV_DTYPES, c_kernel_fits
from engine.ops.kernels import kernel_runs
from engine.ops.native import address
from engine.ops.quant import kernels as quant_kernels
from engine.ops.quant.experts import ExpertMatrix, InPlaceRows
from engine.ops.quant.experts_native import WfExperts, WfMoE, expert_products, experts_struct
from engine.ops.quant.matrix import QuantMatrix
from engine.text.model_config import ModelConfig

if TYPE_CHECKING:
    from engine.kv.kv_pool import KVPool
    from engine.loader.weights import LayerWeights, Weights
    from engine.step import RopeTables, StepLayout

Array = Any
_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64


class _Matrix(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("gshift", ctypes.c_int), ("codes", _ptr),
                ("scale", _ptr), ("offset", _ptr), ("n", _i64), ("k", _i64)]  # fmt: skip


class _Layer(ctypes.Structure):
    _fields_ = [
        ("attn_norm", _ptr),
        ("ffn_norm", _ptr),
        ("qkv", _Matrix),
        ("wo", _Matrix),
        ("gate_up", _Matrix),
        ("down", _Matrix),
        ("qkv_bias", _ptr),
        ("q_norm", _ptr),
        ("k_norm", _ptr),
        ("moe", ctypes.POINTER(WfMoE)),  # NULL: a dense FFN
        ("attn", WfExperts * 4),  # q, k, v, o read in the file's blocks, where attn_in_place
        ("attn_in_place", ctypes.c_int),
        ("attn_products", ctypes.c_int),
        ("o_bias", _ptr),  # gpt-oss's: NULL where the layer has none
        ("sinks", _ptr),
        ("window", _i64),
    ]


class _Shape(ctypes.Structure):
    _fields_ = [
        ("dim", _i64),
        ("heads", _i64),
        ("kv_heads", _i64),
        ("head_dim", _i64),
        ("ffn_dim", _i64),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("moe_stats", _ptr),
        ("kv_kind", ctypes.c_int),
    ]


def _matrix(w: QuantMatrix) -> _Matrix:
    codes, scale, offset = w.pointers
    return _Matrix(w.c_kind, w.gshift, codes, scale, offset, w.shape[0], w.k)


def _vector(a: Array) -> int | None:
    ok = isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous
    return int(a.ctypes.data) if ok else None


def _in_place(lw: LayerWeights) -> list[ExpertMatrix] | None:
    """q, k, v and the output matrix where the layer reads them in the file's blocks."""
    if isinstance(lw.wqkv, InPlaceRows) and isinstance(lw.wo, ExpertMatrix):
        return [*lw.wqkv.parts, lw.wo] if len(lw.wqkv.parts) == 3 else None
    return None


def _descriptor(lw: LayerWeights) -> _Layer | None:
    """The layer's descriptor for wf_layers; None where some part of it would not run in
    the C kernels."""
    experts = None if lw.moe is None else lw.moe.native
    attn = _in_place(lw)
    decoded = (lw.wqkv, lw.wo) if attn is None else ()
    ffn = (lw.w_gate_up, lw.w_down) if lw.moe is None else ()
    norms = (_vector(lw.attn_norm), _vector(lw.ffn_norm))
    optional = (lw.bqkv, lw.q_norm, lw.k_norm, lw.bo, lw.sinks)  # None: the layer has none
    extras = tuple(None if a is None else _vector(a) for a in optional)
    if (
        not all(isinstance(m, QuantMatrix) for m in (*decoded, *ffn))
        or None in norms
        or any(a is not None and e is None for a, e in zip(optional, extras, strict=True))
        or (lw.moe is not None and experts is None)
    ):
        return None
    unread = [_Matrix(), _Matrix()]  # read in place instead (the attention, the experts)
    attention = [_matrix(m) for m in decoded] or unread
    dense_ffn = [_matrix(m) for m in ffn] or unread
    moe = None if experts is None else ctypes.pointer(experts.struct)
    layer = _Layer(*norms, *attention, *dense_ffn, *extras[:3], moe)
    layer.o_bias, layer.sinks, layer.window = *extras[3:], lw.window
    if attn is not None:
        layer.attn = (WfExperts * 4)(*(experts_struct(m) for m in attn))
        layer.attn_in_place, layer.attn_products = 1, int(expert_products())
    return layer


@dataclass(frozen=True, slots=True)
class NativeLayers:
    """The layers' descriptors for wf_layers: pointers into `weights`, kept alive here."""

    layers: ctypes.Array[_Layer]
    config: ModelConfig
    weights: Weights  # what the descriptors point into
    fn: Any  # wf_layers

    @classmethod
    def build(cls, weights: Weights, config: ModelConfig) -> NativeLayers | None:
        """None where some part would not run in the C kernels (then forward.py runs the
        family's layer op by op)."""
        lib, c = native.library(), config
        if not (
            lib is not None
            and quant_kernels().name == "c"
            and c.dim % 16 == 0 and c.ffn_dim % 16 == 0 and c.head_dim % 32 == 0
            and c_kernel_fits(c.num_heads, c.num_kv_heads, c.head_dim)
        ):  # fmt: skip
            return None
        found = [_descriptor(lw) for lw in weights.layers]
        descriptors = [d for d in found if d is not None]
        if len(descriptors) < len(found):
            return None
        fn = lib.wf_layers
        p = _ptr
        fn.argtypes = [p, _i64, p, p, _i64, p, p, p, p, p, p, p, p, _i64, p, ctypes.c_int]
        fn.restype = _i64  # 0, or the scratch bytes refused
        return cls((_Layer * len(descriptors))(*descriptors), config, weights, fn)

    @property
    def dense_ffn_dim(self) -> int:
        """The dense FFN's width where some layer has one (0: every layer has experts)."""
        dense = any(lw.moe is None for lw in self.weights.layers)
        return self.config.ffn_dim if dense else 0

    @property
    def moe_stats(self) -> int | None:
        """Where the experts' kernel counts what it reads (None: a dense model)."""
        moe = self.weights.layers[0].moe
        return None if moe is None else address(moe.stats)

    def _shape(self, pool: KVPool) -> _Shape:
        c = self.config
        return _Shape(
            c.dim,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            self.dense_ffn_dim,
            c.rms_eps,
            c.head_dim**-0.5,
            self.moe_stats,
            KINDS.index(pool.dtype),  # layers.c's kv_kind
        )

    def run(self, x: np.ndarray, positions: np.ndarray, rope: RopeTables, pool: KVPool,
            step: StepLayout, threads: int) -> bool:  # fmt: skip
        """Every layer over x [N, dim] in place, writing the step's keys and values into
        `pool`; False (nothing done) where this step has rows outside the kernels. Raises
        MemoryError (nothing done) where the step's scratch cannot be allocated."""
        plan = step.attention
        every_row = all(kernel for *_, kernel in kernel_runs(step.runs))
        if not (
            every_row and len(plan.kernel_rows) == x.shape[0]
            and pool.xp is np and pool.dtype in KERNEL_KV_DTYPES
            and all(a.flags.c_contiguous for a in (*pool.k_groups, *pool.v_groups))
            and x.dtype == np.float32 and x.flags.c_contiguous
            and positions.dtype == np.int64 and positions.flags.c_contiguous
            and _vector(rope.cos) is not None and _vector(rope.sin) is not None
        ):  # fmt: skip
            return False
        shape = self._shape(pool)
        k_groups, v_groups, kv_layout = _pool_layout(pool)
        kv_rows = np.ascontiguousarray(np.concatenate(step.group_rows), dtype=np.int64)
        tables = _tables(step)
        refused = self.fn(
            self.layers,
            len(self.layers),
            ctypes.byref(shape),
            address(x),
            x.shape[0],
            address(positions),
            address(rope.cos),
            address(rope.sin),
            address(k_groups),
            address(v_groups),
            address(kv_layout),
            address(kv_rows),
            address(tables),
            tables.shape[2],
            address(plan.lengths),
            threads,
        )
        if refused:
            raise native.scratch_refused("wf_layers", refused, f"a {x.shape[0]}-row step")
        return True


@functools.lru_cache(maxsize=8)  # once per pool, not every step
def _pool_layout(pool: KVPool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """layers.c's k_groups and v_groups (each group's array's address) and kv_layout (each
    layer's group and where its keys start in the group's arrays, in items)."""
    k_groups = np.asarray([address(a) for a in pool.k_groups], dtype=np.uint64)
    v_groups = np.asarray([address(a) for a in pool.v_groups], dtype=np.uint64)
    layout = [
        (g, pool.index_in_group[layer] * pool.k_groups[g][0].size)
        for layer, g in enumerate(pool.group_of)
    ]
    return k_groups, v_groups, np.asarray(layout, dtype=np.int64)


def _tables(step: StepLayout) -> np.ndarray:
    """Every group's attention tables in one array [groups, rows, widest] (int32)."""
    plans = step.group_plans
    if len(plans) == 1:
        return np.ascontiguousarray(plans[0].tables)[None]
    width = max(p.tables.shape[1] for p in plans)
    out = np.zeros((len(plans), plans[0].tables.shape[0], width), dtype=np.int32)
    for g, p in enumerate(plans):
        out[g, :, : p.tables.shape[1]] = p.tables
    return out


def native_layers(weights: Weights, config: ModelConfig) -> NativeLayers | None:
    """The weights' NativeLayers, built on first use and kept on the weights (None where
    the model's layers do not all run in the C kernels)."""
    if weights.native is None:
        weights.native = NativeLayers.build(weights, config) or False
    return weights.native or None
