"""The llama forward pass over a flat batch of tokens from many sequences.

Pure functions of their inputs: weights, token ids, positions and caches come in as arguments;
`xp` is numpy or cupy. Shapes: N tokens in the batch, H heads, G = H / Hkv query heads per KV
head, D head_dim, T keys of a sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from engine import gpu_ops
from engine.attention import AttentionPlan, kernel_row_limit, paged_attention
from engine.config import ModelConfig
from engine.elementwise import head_rms_norm, rms_norm, silu_mul
from engine.elementwise import rope as apply_rope
from engine.kernels import RowRuns, get_num_threads, matmul_t, plan_rows
from engine.kv_pool import KVPool, PagedKV
from engine.native_layers import native_layers
from engine.weights import LayerWeights, Weights

Array = Any


@dataclass(slots=True)
class Segment:
    """A run of consecutive tokens of one sequence inside the flat batch."""

    kv: PagedKV
    start: int  # position of the segment's first token; the KV holds [0, start)
    length: int
    want_logits: bool  # logits of the segment's last token are needed


@dataclass(frozen=True, slots=True)
class RopeTables:
    cos: Array  # [context, D/2]
    sin: Array  # [context, D/2]

    @classmethod
    def build(
        cls, config: ModelConfig, dtype: Any, xp: ModuleType, divisors: Any = None
    ) -> RopeTables:
        """cos and sin of every position's angle for each of the head's frequencies, each
        frequency divided by `divisors` when given (engine.rope.frequency_divisors)."""
        half = config.head_dim // 2
        inv_freq = 1.0 / config.rope_base ** (
            xp.arange(half, dtype=xp.float64) * 2 / config.head_dim
        )
        if divisors is not None:
            inv_freq = inv_freq / xp.asarray(divisors, dtype=xp.float64)
        angles = xp.arange(config.context_length, dtype=xp.float64)[:, None] * inv_freq[None, :]
        return cls(cos=xp.cos(angles).astype(dtype), sin=xp.sin(angles).astype(dtype))


@dataclass(frozen=True, slots=True)
class StepLayout:
    """Where a step's rows go, worked out once for all layers: the matrix kernels' row
    runs, where each token's keys and values go in the pool, and the attention plan."""

    pool: KVPool
    runs: RowRuns
    kv_rows: Array  # [N * Hkv] see KVPool.flat_rows
    attention: AttentionPlan

    @classmethod
    def build(cls, pool: KVPool, segments: list[Segment]) -> StepLayout:
        where = [seg.kv.slots(seg.start, seg.length) for seg in segments]
        c = pool.config
        spans = [(seg.kv.blocks, seg.start, seg.length) for seg in segments]
        if pool.xp is np:
            plan = AttentionPlan.build(
                spans, kernel_row_limit(c.num_heads, c.num_kv_heads, c.head_dim),
                compiled=pool.dtype == np.float32,
            )  # fmt: skip
        else:  # CuPy: every row in the kernel where it takes this pool
            gpu = pool.dtype == np.float32 and gpu_ops.attention_fits(c.head_dim)
            plan = AttentionPlan.build(spans, None, compiled=gpu).to(pool.xp)
        blocks, slots = (np.concatenate(parts) for parts in zip(*where, strict=True))
        rows = pool.xp.asarray(pool.flat_rows(blocks, slots))
        return cls(pool, plan_rows([seg.length for seg in segments]), rows, plan)


def attention_block(
    x: Array,
    lw: LayerWeights,
    layer: int,
    config: ModelConfig,
    rope: RopeTables,
    positions: Array,
    step: StepLayout,
    xp: ModuleType,
) -> Array:
    n_tok = x.shape[0]
    runs = step.runs
    h = rms_norm(x, lw.attn_norm, config.rms_eps, xp)
    qkv = matmul_t(h, lw.wqkv, runs)  # [N, q_dim + 2 * kv_dim]
    if lw.bqkv is not None:
        qkv += lw.bqkv
    hd, kvd, qd = config.head_dim, config.kv_dim, config.q_dim
    if lw.q_norm is not None:  # Qwen 3: each head's q and k normed before rope
        head_rms_norm(qkv, 0, config.num_heads, hd, lw.q_norm, config.rms_eps, xp)
        head_rms_norm(qkv, qd, config.num_kv_heads, hd, lw.k_norm, config.rms_eps, xp)
    tables = (rope.cos, rope.sin)
    pool = step.pool
    # this step's keys and values into the pool first
    if gpu_ops.gpu_float32(qkv, pool.k):  # CuPy: q, k and v in one launch
        q = gpu_ops.rope_into_pool(qkv, config.num_heads, config.num_kv_heads, hd, tables,
                                   positions, step.kv_rows, pool.row_shift(layer), pool.k,
                                   pool.v)  # fmt: skip
    else:
        q = apply_rope(qkv, 0, config.num_heads, hd, tables, positions, xp)  # [N, H, D]
        k = apply_rope(qkv, qd, config.num_kv_heads, hd, tables, positions, xp)
        v = qkv[:, qd + kvd :].reshape(n_tok, -1, hd)
        pool.write_layer(layer, step.kv_rows, k, v)
    out = paged_attention(q, pool.k[layer], pool.v[layer], step.attention, xp)
    return matmul_t(out, lw.wo, runs)


def mlp_block(
    x: Array, lw: LayerWeights, config: ModelConfig, runs: RowRuns, xp: ModuleType
) -> Array:
    h = rms_norm(x, lw.ffn_norm, config.rms_eps, xp)
    gate_up = matmul_t(h, lw.w_gate_up, runs)  # [N, 2 * ffn]
    return matmul_t(silu_mul(gate_up, config.ffn_dim, xp), lw.w_down, runs)


def forward(
    weights: Weights,
    config: ModelConfig,
    rope: RopeTables,
    pool: KVPool,
    tokens: Array,
    positions: Array,
    segments: list[Segment],
    xp: ModuleType,
) -> Array:
    """Run the batch, write its keys and values into the pool where each segment's block
    table says, and return the logits [num segments wanting logits, vocab] of each such
    segment's last token.

    tokens, positions: [N] integer arrays, segments in the order their tokens appear.
    Each segment's blocks must be its own for the positions it writes (PagedKV.prepare_write);
    the caller commits the token ids. A segment's rows are computed the same way whatever
    else is in the batch (see kernels and attention). Where every part of the step runs in
    the C kernels, the layers are one call of them (engine/native_layers.py): the same bits
    as the loop below.
    """
    step = StepLayout.build(pool, segments)
    runs = step.runs
    x = weights.embed_rows(tokens, xp)  # [N, dim]
    native = native_layers(weights, config) if xp is np else None
    if native is None or not native.run(x, positions, rope, pool, step, get_num_threads()):
        for i, lw in enumerate(weights.layers):
            x = x + attention_block(x, lw, i, config, rope, positions, step, xp)
            x = x + mlp_block(x, lw, config, runs, xp)
    last_rows, row = [], 0
    for seg in segments:
        row += seg.length
        if seg.want_logits:
            last_rows.append(row - 1)
    h = rms_norm(x[xp.asarray(last_rows, dtype=xp.int64)], weights.out_norm, config.rms_eps, xp)
    return matmul_t(h, weights.output)  # [M, vocab]
