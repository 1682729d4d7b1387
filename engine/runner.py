"""Builds the arrays for one step, runs the forward pass, and commits the new KV."""

from __future__ import annotations

import numpy as np

from engine.device import threads_for_step
from engine.kv.kv_pool import KVPool
from engine.model import Model
from engine.scheduler import ScheduledBatch
from engine.sequence import Sequence
from engine.step import Segment


class ModelRunner:
    def __init__(self, model: Model, pool: KVPool) -> None:
        self.model = model
        self.pool = pool

    def run(self, batch: ScheduledBatch) -> tuple[np.ndarray, list[Sequence]]:
        """Logits [M, vocab] (host float32) for the M sequences whose next token is due.
        Each sequence's blocks are its own for the positions it writes (prepare_write)."""
        m = self.model
        tokens: list[int] = []
        positions: list[int] = []
        segments: list[Segment] = []
        chunks: list[list[int]] = []
        due: list[Sequence] = []
        for seq, n in batch:
            start = seq.num_computed
            ids = seq.token_slice(start, start + n)
            want = start + n == seq.num_tokens
            segments.append(Segment(seq.cache, start, n, want))
            tokens += ids
            positions += range(start, start + n)
            chunks.append(ids)
            if want:
                due.append(seq)
        if m.xp is np:
            threads_for_step(max(n for _, n in batch))
        logits = m.run(self.pool, tokens, positions, segments)
        for (seq, _), ids in zip(batch, chunks, strict=True):
            seq.cache.commit(ids)
        return logits, due
