"""The forward pass over a flat batch of tokens from many sequences, on NumPy or CuPy: the
model family's layer (engine/models) run with the operations bound here to the step.

Pure functions of their inputs: weights, token ids, positions and caches come in as arguments;
`xp` is numpy or cupy. Shapes: N tokens in the batch, H heads, Hkv KV heads, D head_dim.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from engine.kv.kv_pool import KVPool
from engine.loader.weights import Weights
from engine.models.family import Family
from engine.ops import gpu_ops
from engine.ops.attention import paged_attention
from engine.ops.elementwise import add, head_rms_norm, rms_norm, silu_mul
from engine.ops.elementwise import rope as apply_rope
from engine.ops.kernels import get_num_threads, matmul_t
from engine.ops.moe import moe_ffn
from engine.ops.moe_cuda import CudaExperts, moe_ffn_cuda
from engine.ops.native_layers import native_layers
from engine.ops.quant.experts import MoEWeights
from engine.step import RopeTables, Segment, StepLayout
from engine.text.model_config import ModelConfig

Array = Any


class StepOps:
    """The family layer's operations (engine.models.family.LayerOps) on NumPy or CuPy, bound
    to one step: its positions, the pool and where its rows go."""

    def __init__(
        self,
        config: ModelConfig,
        rope: RopeTables,
        positions: Array,
        step: StepLayout,
        xp: ModuleType,
    ) -> None:
        self.config = config
        self.rope = rope
        self.positions = positions  # [N] int64
        self.step = step
        self.xp = xp

    def norm(self, x: Array, weight: Array) -> Array:
        return rms_norm(x, weight, self.config.rms_eps, self.xp)

    def matmul(self, x: Array, w: Any) -> Array:
        return matmul_t(x, w, self.step.runs)

    def add_bias(self, qkv: Array, bias: Array) -> Array:
        qkv += bias
        return qkv

    def head_norms(self, qkv: Array, q_norm: Array, k_norm: Array) -> Array:
        c = self.config
        head_rms_norm(qkv, 0, c.num_heads, c.head_dim, q_norm, c.rms_eps, self.xp)
        head_rms_norm(qkv, c.q_dim, c.num_kv_heads, c.head_dim, k_norm, c.rms_eps, self.xp)
        return qkv

    def attend(self, qkv: Array, layer: int, window: int = 0, sinks: Array | None = None) -> Array:
        # qkv: [N, q_dim + 2 * kv_dim]; this step's keys and values into the pool first
        c, pool, xp = self.config, self.step.pool, self.xp
        hd, qd, kvd = c.head_dim, c.q_dim, c.kv_dim
        tables, positions = (self.rope.cos, self.rope.sin), self.positions
        kv_rows, plan = self.step.for_layer(layer)
        one_launch = gpu_ops.gpu_float32(qkv) and gpu_ops.rope_writes(pool.k)
        if one_launch and len(pool.groups) == 1:  # CuPy: one launch
            q = gpu_ops.rope_into_pool(
                qkv,
                c.num_heads,
                c.num_kv_heads,
                hd,
                tables,
                positions,
                kv_rows,
                pool.row_shift(layer),
                pool.k,
                pool.v,
            )
        else:
            q = apply_rope(qkv, 0, c.num_heads, hd, tables, positions, xp)  # [N, H, D]
            k = apply_rope(qkv, qd, c.num_kv_heads, hd, tables, positions, xp)
            v = qkv[:, qd + kvd :].reshape(qkv.shape[0], -1, hd)
            pool.write_layer(layer, kv_rows, k, v)
        return paged_attention(q, *pool.layer_kv(layer), plan, xp, window, sinks)

    def silu_mul(self, gate_up: Array) -> Array:
        return silu_mul(gate_up, self.config.ffn_dim, self.xp)

    def residual(self, x: Array, y: Array) -> Array:
        return add(x, y, self.xp)

    def experts(self, x: Array, moe: MoEWeights | CudaExperts) -> Array:
        if isinstance(moe, CudaExperts):
            return moe_ffn_cuda(x, moe, self.xp)
        return moe_ffn(x, moe)


def forward(
    weights: Weights,
    config: ModelConfig,
    family: Family,
    rope: RopeTables,
    pool: KVPool,
    tokens: Array,
    positions: Array,
    segments: list[Segment],
    xp: ModuleType,
    step: StepLayout | None = None,
) -> Array:
    """Run the batch, write its keys and values into the pool where each segment's block
    table says, and return the logits [num segments wanting logits, vocab] of each such
    segment's last token (`step`: its layout, where the caller built it already).

    tokens, positions: [N] integer arrays, segments in the order their tokens appear.
    Each segment's blocks must be its own for the positions it writes (PagedKV.prepare_write);
    the caller commits the token ids. A segment's rows are computed the same way whatever
    else is in the batch (see kernels and attention). Where every part of the step runs in
    the C kernels and the family's layer is theirs, the layers are one call of them
    (engine/ops/native_layers.py): the same bits as the family's layer run op by op.
    """
    if step is None:
        step = StepLayout.build(pool, segments, weights.in_place)
    x = weights.embed_rows(tokens, xp)  # [N, dim]
    native = native_layers(weights, config) if xp is np and family.native_layers else None
    if native is None or not native.run(x, positions, rope, pool, step, get_num_threads()):
        x = _layers(weights, config, family, rope, x, positions, step, xp)
    last_rows, row = [], 0
    for seg in segments:
        row += seg.length
        if seg.want_logits:
            last_rows.append(row - 1)
    h = rms_norm(x[xp.asarray(last_rows, dtype=xp.int64)], weights.out_norm, config.rms_eps, xp)
    return matmul_t(h, weights.output)  # [M, vocab]


def forward_static(
    weights: Weights,
    config: ModelConfig,
    family: Family,
    rope: RopeTables,
    tokens: Array,
    positions: Array,
    layout: StepLayout,
    logits: Array,
    xp: ModuleType,
) -> None:
    """A decode step of one token a row (engine/decode_graphs.py), op by op, every row's
    logits into `logits` [N, vocab] in place: what a captured graph replays, reading only
    the arrays it is given."""
    x = weights.embed_rows(tokens, xp)  # [N, dim]
    x = _layers(weights, config, family, rope, x, positions, layout, xp)
    h = rms_norm(x, weights.out_norm, config.rms_eps, xp)
    logits[...] = matmul_t(h, weights.output)  # [N, vocab]


def _layers(
    weights: Weights,
    config: ModelConfig,
    family: Family,
    rope: RopeTables,
    x: Array,
    positions: Array,
    step: StepLayout,
    xp: ModuleType,
) -> Array:
    """x [N, dim] through the family's layer, op by op."""
    ops = StepOps(config, rope, positions, step, xp)
    for i, lw in enumerate(weights.layers):
        x = family.layer(x, lw, i, ops)
    return x
