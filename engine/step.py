"""The data types of one forward step, shared by the backends, the families' layers and the
runner: which tokens of which sequences it runs (Segment), the rotation tables (RopeTables)
and where its rows go, worked out once for all layers (StepLayout).

Shapes: N tokens in the step, Hkv KV heads, D head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from engine.kv.kv_pool import KVPool, PagedKV
from engine.loader.rope import RopeScaling
from engine.ops import gpu_ops
from engine.ops.attention import AttentionPlan
from engine.ops.attention_rows import kernel_reads, kernel_row_limit
from engine.ops.kernels import SMALL_ROWS, RowRuns, plan_rows
from engine.text.model_config import ModelConfig

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
        cls, config: ModelConfig, dtype: Any, xp: ModuleType, scaling: RopeScaling | None = None
    ) -> RopeTables:
        """cos and sin of every position's angle for each of the head's frequencies, as the
        file's rope scaling says (engine.loader.rope.rope_scaling)."""
        half = config.head_dim // 2
        inv_freq = 1.0 / config.rope_base ** (
            xp.arange(half, dtype=xp.float64) * 2 / config.head_dim
        )
        scaling = scaling or RopeScaling()
        if scaling.divisors is not None:
            inv_freq = inv_freq / xp.asarray(scaling.divisors, dtype=xp.float64)
        angles = xp.arange(config.context_length, dtype=xp.float64)[:, None] * inv_freq[None, :]
        m = scaling.magnitude
        return cls(cos=(xp.cos(angles) * m).astype(dtype), sin=(xp.sin(angles) * m).astype(dtype))


@dataclass(frozen=True, slots=True)
class StepLayout:
    """Where a step's rows go, worked out once for all layers: the matrix kernels' row
    runs, and per block group of the pool (engine/kv/block_groups.py) where each token's
    keys and values go and the attention plan (kv_rows and attention: the first group's)."""

    pool: KVPool
    runs: RowRuns
    group_rows: tuple[Array, ...]  # [N * Hkv] each, see KVPool.flat_rows
    group_plans: tuple[AttentionPlan, ...]

    @property
    def kv_rows(self) -> Array:
        return self.group_rows[0]

    @property
    def attention(self) -> AttentionPlan:
        return self.group_plans[0]

    def for_layer(self, layer: int) -> tuple[Array, AttentionPlan]:
        """The rows and attention plan of a layer's group."""
        g = self.pool.group_of[layer]
        return self.group_rows[g], self.group_plans[g]

    @classmethod
    def build(cls, pool: KVPool, segments: list[Segment], in_place: bool = False) -> StepLayout:
        """in_place: the model's products take every row of any chunk in the kernels
        (Weights.in_place): its runs say so, and its attention takes them too wherever the
        C kernel fits (then the all-layers call can take any chunk, whatever the build)."""
        c = pool.config
        if pool.xp is np:
            limit = kernel_row_limit(c.num_heads, c.num_kv_heads, c.head_dim, in_place)
            compiled = kernel_reads(pool.dtype)
        else:  # CuPy: every row in the kernel where it takes this pool
            fits = pool.k.dtype in gpu_ops.ATTENTION_KERNELS and gpu_ops.attention_fits(c.head_dim)
            limit, compiled = None, fits
        rows, plans = [], []
        for g in range(len(pool.groups)):
            spans = [(seg.kv.tables[g], seg.start, seg.length) for seg in segments]
            plan = AttentionPlan.build(spans, limit, compiled)
            plans.append(plan if pool.xp is np else plan.to(pool.xp))
            where = [seg.kv.slots(seg.start, seg.length, g) for seg in segments]
            blocks, slots = (np.concatenate(parts) for parts in zip(*where, strict=True))
            rows.append(pool.xp.asarray(pool.flat_rows(blocks, slots)))
        lengths = [seg.length for seg in segments]
        runs = plan_rows(lengths, None if in_place else SMALL_ROWS)
        return cls(pool, runs, tuple(rows), tuple(plans))
