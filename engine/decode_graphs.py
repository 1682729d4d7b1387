"""Decode steps replayed instead of launched op by op (issue 37): on CuPy a step of the
default model is ~12 launches a layer, each paying Python, so a GPU step costs 100x what
its weight reads do. A decode step (every segment one token wanting its logits) of B rows
runs padded to the smallest bucket >= B; each bucket's graph is captured on first use and
replayed after, reading its inputs from buffers at fixed addresses and writing its logits
to one: a StaticStep, allocated once per bucket and reused by every later step of it.

Padding rows read token 0 at position 0 and write their keys and values into a block of
each group held for the graphs' life (taken from the pool's allocator, so the pool's
accounting counts it); they attend to that block alone. Every row is computed as it is
eagerly (the kernels are batch invariant), so a replayed step gives the eager step's bits.

The capture is behind `Capturer`: `Rerun` replays by running the step again from the
static buffers (the CPU's, and what the tests drive); `CudaCapturer` records the launches
into a CUDA graph through CuPy's stream capture, each graph with a memory pool of its own
that nothing else allocates from, so what its launches address stays theirs.
Not verified on a GPU yet: the model's steps use it only where WARMFLEET_DECODE_GRAPHS=1
asks (engine/graph_steps.py) until it is (bench/gpu_check.sh).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from engine.kv.kv_pool import KVPool
from engine.ops.attention import AttentionPlan
from engine.ops.kernels import plan_rows
from engine.step import StepLayout

Array = Any
BUCKETS = (1, 2, 4, 8, 16, 32)  # rows a captured step runs


def bucket_for(rows: int, buckets: tuple[int, ...] = BUCKETS) -> int | None:
    """The smallest bucket that holds `rows`; None past the largest (run eagerly)."""
    return next((b for b in buckets if b >= rows), None)


class Capturer(Protocol):
    def capture(self, run: Callable[[], None]) -> Callable[[], None]:
        """What replays `run`'s work; nothing of it has to have run yet (a CUDA capture
        records the launches without running them)."""
        ...


class Rerun:
    """Replays by running again: no graph, the same buffers and bookkeeping."""

    def capture(self, run: Callable[[], None]) -> Callable[[], None]:
        return run


class CudaCapturer:
    """CUDA graphs through CuPy's stream capture, on a stream of their own."""

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.pools: list[Any] = []  # each graph's memory, kept as long as it is

    def capture(self, run: Callable[[], None]) -> Callable[[], None]:
        cp = self.cupy
        pool = cp.cuda.MemoryPool()
        self.pools.append(pool)
        caller = cp.cuda.get_current_stream()  # where the step's inputs were filled
        with cp.cuda.using_allocator(pool.malloc), self.stream:
            # once eagerly first: the graph's pool then holds every buffer the step takes, so
            # the capture allocates nothing new (cudaMalloc in a capture may be refused); the
            # step reads only its static inputs, so running it twice writes the same values
            self.stream.wait_event(caller.record())
            run()
            self.stream.synchronize()
            self.stream.begin_capture()
            run()
            graph = self.stream.end_capture()
        graph.upload(self.stream)

        def replay() -> None:  # ordered after the caller's stream's work, and it after it
            caller = cp.cuda.get_current_stream()
            self.stream.wait_event(caller.record())
            graph.launch(self.stream)
            caller.wait_event(self.stream.record())

        return replay


@dataclass(slots=True)
class StaticStep:
    """A bucket's inputs at fixed addresses, what its graph reads, and its logits."""

    tokens: Array  # [b] int64
    positions: Array  # [b] int64
    rows: tuple[Array, ...]  # per block group, [b * Hkv]: where each row's keys go
    tables: tuple[Array, ...]  # per block group, [b, width] int32
    lengths: tuple[Array, ...]  # per block group, [b] int32
    logits: Array  # [b, vocab]

    def layout(self, pool: KVPool) -> StepLayout:
        b = len(self.tokens)
        plans = tuple(
            AttentionPlan(np.arange(b, dtype=np.int64), t, n, ())
            for t, n in zip(self.tables, self.lengths, strict=True)
        )
        return StepLayout(pool, plan_rows([1] * b), self.rows, plans)


# run(static, layout): the step's forward from the static inputs into static.logits
StaticRun = Callable[[StaticStep, StepLayout], None]


class DecodeGraphs:
    """One captured step per bucket for one model and pool."""

    def __init__(
        self, pool: KVPool, vocab: int, run: StaticRun, capturer: Capturer, width: int
    ) -> None:
        self.pool = pool
        self.vocab = vocab
        self.run_static = run
        self.capturer = capturer
        self.width = width  # block table entries a captured step holds
        self.pad_blocks = [alloc.allocate() for alloc in pool.allocs]
        self.steps: dict[int, StaticStep] = {}
        self.replays: dict[int, Callable[[], None]] = {}

    def fits(self, layout: StepLayout, num_rows: int) -> bool:
        """Whether a step runs captured: a bucket holds its rows, every row in the attention
        kernel (decode), and its tables within the captured width."""
        plans = layout.group_plans
        return bucket_for(num_rows) is not None and all(
            len(p.kernel_rows) == num_rows and not p.chunks and p.tables.shape[1] <= self.width
            for p in plans
        )

    def run(self, tokens: Array, positions: Array, layout: StepLayout) -> Array:
        """The step's logits [rows, vocab] (a view of its bucket's buffer: copy it before the
        next step of that bucket); `fits(layout, rows)` first."""
        rows = len(tokens)
        bucket = bucket_for(rows)
        assert bucket is not None
        step = self.steps.get(bucket) or self._new_step(bucket)
        self._fill(step, tokens, positions, layout)
        replay = self.replays.get(bucket)
        if replay is None:
            fixed = step.layout(self.pool)
            replay = self.capturer.capture(lambda: self.run_static(step, fixed))
            self.replays[bucket] = replay
        replay()
        return step.logits[:rows]

    def _new_step(self, b: int) -> StaticStep:
        xp, pool = self.pool.xp, self.pool
        hkv = pool.config.num_kv_heads
        groups = range(len(pool.allocs))
        step = StaticStep(
            tokens=xp.zeros(b, dtype=xp.int64),
            positions=xp.zeros(b, dtype=xp.int64),
            rows=tuple(xp.zeros(b * hkv, dtype=xp.int64) for _ in groups),
            tables=tuple(xp.zeros((b, self.width), dtype=xp.int32) for _ in groups),
            lengths=tuple(xp.ones(b, dtype=xp.int32) for _ in groups),
            logits=xp.zeros((b, self.vocab), dtype=xp.float32),
        )
        self.steps[b] = step
        return step

    def _fill(self, step: StaticStep, tokens: Array, positions: Array, layout: StepLayout) -> None:
        """The step's inputs into the bucket's buffers (in place: the graph reads these
        addresses); the rows past it padding."""
        xp, n, b = self.pool.xp, len(tokens), len(step.tokens)
        hkv = self.pool.config.num_kv_heads
        step.tokens[:n], step.tokens[n:] = xp.asarray(tokens), 0
        step.positions[:n], step.positions[n:] = xp.asarray(positions), 0
        pads = np.zeros(b - n, dtype=np.int64)
        for g, plan in enumerate(layout.group_plans):
            pad = self.pool.flat_rows(pads + self.pad_blocks[g], pads)  # slot 0 of its block
            step.rows[g][: n * hkv] = layout.group_rows[g]
            step.rows[g][n * hkv :] = xp.asarray(pad)
            table = step.tables[g]
            table[...] = 0
            table[:n, : plan.tables.shape[1]] = xp.asarray(plan.tables)
            table[n:, 0] = self.pad_blocks[g]
            step.lengths[g][:n] = xp.asarray(plan.lengths)
            step.lengths[g][n:] = 1
