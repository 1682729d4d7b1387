"""The forward pass on MLX over a flat batch of tokens from many sequences: the model
family's layer (engine/models) with the operations bound here, the same inputs and results
as engine/forward.py. MLX builds the step's graph lazily; it is evaluated once, at the end
(the logits and the pool's new arrays together).

Attention: every segment of up to SMALL_ROWS tokens (decode rows, short prefill chunks)
goes into one scaled_dot_product_attention call per layer, padded to the longest such
segment, over the keys its block table names (gathered by row); each longer prefill chunk
is a call of its own. Shapes: N tokens, H heads, Hkv KV heads, D head_dim, S segments in a
call, L query rows per segment, W keys per segment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from engine.loader.rope import RopeScaling
from engine.loader.weights import Weights
from engine.mlx_backend import mx_dtype
from engine.mlx_backend.experts import MLXExperts, moe_ffn
from engine.mlx_backend.kv_pool import MLXKVPool
from engine.models.family import Family
from engine.ops.kernels import SMALL_ROWS
from engine.step import RopeTables, Segment
from engine.text.model_config import ModelConfig


def rope_tables(
    config: ModelConfig, dtype: np.dtype[Any], scaling: RopeScaling | None = None
) -> RopeTables:
    """engine/step.py's tables (computed in float64 on the host) as MLX arrays."""
    host = RopeTables.build(config, dtype, np, scaling)
    return RopeTables(cos=mx.array(host.cos), sin=mx.array(host.sin))


@dataclass(frozen=True, slots=True)
class AttentionCall:
    queries: Any  # [S, L] int32: the step's row of each query (padding repeats a row)
    keys: Any  # [S, W] int32: the pool row of each key (padding: row 0, masked)
    mask: Any  # [S, 1, L, W] bool: query may see key
    valid: Any  # [n] int32: the real queries among the S * L, in row order
    window_mask: Any  # mask, each query seeing its last `window` keys only (None: no window)

    @classmethod
    def build(
        cls, pool: MLXKVPool, segments: list[tuple[Segment, int]], window: int = 0, group: int = 0
    ) -> AttentionCall:
        """segments: (segment, its first row in the step); window: the sliding window of
        the pool's block `group` these keys are in (0: none): each segment's keys then
        start at the first its first query sees (a windowed layer reads its window, not
        the whole sequence)."""
        firsts = [max(0, seg.start + 1 - window) if window else 0 for seg, _ in segments]
        ends = [seg.start + seg.length for seg, _ in segments]
        width = max(t - first for t, first in zip(ends, firsts, strict=True))
        span = max(seg.length for seg, _ in segments)
        s = len(segments)
        queries = np.zeros((s, span), dtype=np.int32)
        keys = np.zeros((s, width), dtype=np.int32)
        positions = np.zeros((s, span), dtype=np.int64)  # each query's
        valid: list[int] = []
        for i, (seg, row) in enumerate(segments):
            n, t, first = seg.length, ends[i], firsts[i]
            queries[i] = row + np.minimum(np.arange(span), n - 1)  # padding: the last row
            keys[i, : t - first] = pool.rows(*seg.kv.slots(first, t - first, group), group)
            positions[i] = seg.start + np.minimum(np.arange(span), n - 1)
            valid += range(i * span, i * span + n)
        key_positions = np.asarray(firsts)[:, None] + np.arange(width)  # [S, W]
        mask = key_positions[:, None, None, :] <= positions[:, None, :, None]
        if window:  # the keys each query still sees: its last `window`
            mask &= key_positions[:, None, None, :] > positions[:, None, :, None] - window
        valid_rows = mx.array(np.asarray(valid, dtype=np.int32))
        masks = mx.array(mask)
        return cls(mx.array(queries), mx.array(keys), masks, valid_rows, masks if window else None)

    def attend(
        self, q: Any, pool: MLXKVPool, layer: int, scale: float, window: int, sinks: Any
    ) -> Any:
        """q [N, H, D] over the layer's keys and values in `pool` (the last `window` of
        them where window > 0; sinks [H] in the softmax's denominators where given).
        Returns [n, H * D]."""
        s, span = self.queries.shape
        qs = q[self.queries].transpose(0, 2, 1, 3)  # [S, H, L, D]
        ks, vs = (a.transpose(0, 2, 1, 3) for a in pool.read(layer, self.keys, q.dtype))
        mask = self.window_mask if window else self.mask
        out = mx.fast.scaled_dot_product_attention(
            qs,
            ks,
            vs,
            scale=scale,
            mask=mask,
            sinks=None if sinks is None else sinks.astype(q.dtype),
        )
        heads, dim = out.shape[1], out.shape[3]
        return out.transpose(0, 2, 1, 3).reshape(s * span, heads * dim)[self.valid]


@dataclass(frozen=True, slots=True)
class StepPlan:
    """Where a step's rows go, worked out once for all layers, per block group of the pool
    (engine/kv/block_groups.py)."""

    rows: tuple[Any, ...]  # per group, [N] int32: the pool row each token's keys go to
    calls: tuple[tuple[AttentionCall, ...], ...]  # per group
    order: Any  # [N] int32 or None: the step's rows from the calls' outputs, concatenated
    last_rows: Any  # [M] int32: the rows whose logits are wanted

    @classmethod
    def build(cls, pool: MLXKVPool, segments: list[Segment]) -> StepPlan:
        placed, row, last = [], 0, []
        for seg in segments:
            placed.append((seg, row))
            row += seg.length
            if seg.want_logits:
                last.append(row - 1)
        short = [p for p in placed if p[0].length <= SMALL_ROWS]
        runs = ([short] if short else []) + [[p] for p in placed if p[0].length > SMALL_ROWS]
        rows, calls = [], []
        for g, group in enumerate(pool.groups):
            where = [seg.kv.slots(seg.start, seg.length, g) for seg in segments]
            rows.append(mx.array(np.concatenate([pool.rows(b, s, g) for b, s in where])))
            calls.append(tuple(AttentionCall.build(pool, r, group.window, g) for r in runs))
        first_rows = np.concatenate([np.arange(r, r + s.length) for run in runs for s, r in run])
        inverse = np.argsort(first_rows).astype(np.int32)  # calls' order -> the step's
        identity = bool((first_rows == np.arange(row)).all())
        order = None if identity else mx.array(inverse)
        last_rows = mx.array(np.asarray(last, dtype=np.int32))
        return cls(tuple(rows), tuple(calls), order, last_rows)

    def attend(
        self, q: Any, pool: MLXKVPool, layer: int, scale: float, window: int = 0, sinks: Any = None
    ) -> Any:
        calls = self.calls[pool.group_of[layer]]
        outs = [c.attend(q, pool, layer, scale, window, sinks) for c in calls]
        out = outs[0] if len(outs) == 1 else mx.concatenate(outs)
        return out if self.order is None else out[self.order]


def _rope(x: Any, cos: Any, sin: Any) -> Any:
    """x [N, h, D] with q/k in split-half order, rotated; cos, sin [N, 1, D/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return mx.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


class MLXOps:
    """The family layer's operations (engine.models.family.LayerOps) on MLX, bound to one
    step: its rotation at each row's position, the pool and the attention calls."""

    def __init__(
        self, config: ModelConfig, rope: tuple[Any, Any], pool: MLXKVPool, plan: StepPlan
    ) -> None:
        self.config = config
        self.rope = rope  # cos, sin [N, 1, D/2]
        self.pool = pool
        self.plan = plan

    def norm(self, x: Any, weight: Any) -> Any:
        return mx.fast.rms_norm(x, weight, self.config.rms_eps)

    def matmul(self, x: Any, w: Any) -> Any:
        return w.matmul(x)

    def add_bias(self, qkv: Any, bias: Any) -> Any:
        return qkv + bias

    def head_norms(self, qkv: Any, q_norm: Any, k_norm: Any) -> Any:
        c, n = self.config, qkv.shape[0]
        qd, kvd, eps = c.q_dim, c.kv_dim, c.rms_eps
        q = mx.fast.rms_norm(qkv[:, :qd].reshape(n, c.num_heads, c.head_dim), q_norm, eps)
        k = qkv[:, qd : qd + kvd].reshape(n, c.num_kv_heads, c.head_dim)
        k = mx.fast.rms_norm(k, k_norm, eps)
        return mx.concatenate([q.reshape(n, qd), k.reshape(n, kvd), qkv[:, qd + kvd :]], axis=1)

    def attend(self, qkv: Any, layer: int, window: int = 0, sinks: Any = None) -> Any:
        c, n = self.config, qkv.shape[0]
        hd, kvd, qd = c.head_dim, c.kv_dim, c.q_dim
        q = _rope(qkv[:, :qd].reshape(n, c.num_heads, hd), *self.rope)
        k = _rope(qkv[:, qd : qd + kvd].reshape(n, c.num_kv_heads, hd), *self.rope)
        v = qkv[:, qd + kvd :].reshape(n, c.num_kv_heads, hd)
        rows = self.plan.rows[self.pool.group_of[layer]]
        self.pool.write(layer, rows, k, v)  # this step's keys and values first
        return self.plan.attend(q, self.pool, layer, hd**-0.5, window, sinks)

    def silu_mul(self, gate_up: Any) -> Any:
        gate, up = gate_up[:, : self.config.ffn_dim], gate_up[:, self.config.ffn_dim :]
        return gate * mx.sigmoid(gate) * up

    def residual(self, x: Any, y: Any) -> Any:
        return x + y

    def experts(self, x: Any, moe: MLXExperts) -> Any:
        return moe_ffn(x, moe)


def forward(
    weights: Weights,
    config: ModelConfig,
    family: Family,
    rope: RopeTables,
    pool: MLXKVPool,
    tokens: list[int],
    positions: list[int],
    segments: list[Segment],
    dtype: np.dtype[Any],
) -> np.ndarray:
    """As engine/forward.py's forward, computing in `dtype`: the keys and values written
    into the pool, and the logits [segments wanting them, vocab] of each such segment's
    last token (host float32)."""
    plan = StepPlan.build(pool, segments)
    pos = mx.array(np.asarray(positions, dtype=np.int32))
    tables = (rope.cos[pos][:, None, :], rope.sin[pos][:, None, :])
    x = weights.embed.rows(mx.array(np.asarray(tokens, dtype=np.int32)))
    x = x.astype(mx_dtype(dtype))
    ops = MLXOps(config, tables, pool, plan)
    for i, lw in enumerate(weights.layers):
        x = family.layer(x, lw, i, ops)
    if not plan.last_rows.size:  # a prompt's first chunks (and MLX's CPU build dies on
        mx.eval(pool.arrays())  # a quantized product of zero rows)
        return np.zeros((0, config.vocab_size), dtype=np.float32)
    h = mx.fast.rms_norm(x[plan.last_rows], weights.out_norm, config.rms_eps)
    logits = weights.output.matmul(h).astype(mx.float32)
    mx.eval(logits, pool.arrays())
    return np.array(logits)
