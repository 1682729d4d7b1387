"""Which sequences run in the next step, and how many of their tokens. No arrays here."""

from __future__ import annotations

import time
from collections import deque

from engine.config import EngineConfig
from engine.sequence import Sequence, SequenceStatus
from engine.step_cost import StepCost

ScheduledBatch = list[tuple[Sequence, int]]  # each sequence and how many tokens it runs
GROW_AFTER_STEPS = 32  # steps run within a row cap before it doubles


class Scheduler:
    """First come, first served. Every decoding sequence gets one token per step; prompts
    are prefilled in chunks within a per-step token budget so decodes are never starved."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.cost = StepCost()  # the engine reports each step's time
        # after a step ran out of memory: at most this many rows (tokens) a step, until
        # GROW_AFTER_STEPS steps fit and it doubles; None when no step has failed lately
        self.row_cap: int | None = None
        self._steps_in_cap = 0
        self._turn = 0  # where the capped decodes start: each gets its turn

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def put_back(self, seq: Sequence) -> None:
        """A paused sequence returns: to the running ones if it had started, else first in
        line."""
        if seq.status == SequenceStatus.RUNNING:
            self.running.append(seq)
        else:
            self.waiting.appendleft(seq)

    def limit_rows(self, rows: int) -> None:
        """A step of more rows ran out of memory: smaller steps until they fit a while."""
        self.row_cap = max(1, rows)
        self._steps_in_cap = 0

    def step_ran(self) -> None:
        """A step fitted in memory: the cap doubles after GROW_AFTER_STEPS of them."""
        if self.row_cap is None:
            return
        self._steps_in_cap += 1
        if self._steps_in_cap >= GROW_AFTER_STEPS:
            self._steps_in_cap = 0
            self.row_cap *= 2
            if self.row_cap > self.config.max_running + self.config.step_prefill_tokens:
                self.row_cap = None

    def schedule(self) -> ScheduledBatch:
        decoding = [s for s in self.running if not s.prefilling]
        cap = self.row_cap
        if cap is not None and len(decoding) > cap:
            start = self._turn % len(decoding)
            decoding = (decoding[start:] + decoding[:start])[:cap]
            self._turn = start + cap
        batch: ScheduledBatch = [(s, 1) for s in decoding]
        budget = self.config.step_prefill_tokens
        if batch and self.config.step_budget_s is not None:  # decodes must not stall
            budget = self.cost.prefill_tokens(self.config.step_budget_s, budget)
        if cap is not None:
            budget = min(budget, cap - len(batch))
        for seq in self.running:
            if seq.prefilling and budget > 0:
                budget -= self._add_chunk(batch, seq, budget)
        while self.waiting and len(self.running) < self.config.max_running and budget > 0:
            seq = self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            seq.t_scheduled = time.perf_counter()
            self.running.append(seq)
            budget -= self._add_chunk(batch, seq, budget)
        return batch

    def _add_chunk(self, batch: ScheduledBatch, seq: Sequence, budget: int) -> int:
        seq.take_shared_prefix()  # what another sequence computed is not computed again
        n = min(self.config.prefill_chunk_tokens, budget, seq.num_prefill - seq.num_computed)
        batch.append((seq, n))
        return n
