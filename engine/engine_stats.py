"""The engine's counters since it started, and what each step adds to them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class EngineStats:
    """Counters since the engine started."""

    num_steps: int = 0
    num_prefill_tokens: int = 0  # prompt tokens computed (reused ones are not)
    num_decode_tokens: int = 0  # generated tokens fed back through the model
    num_generated_tokens: int = 0  # tokens sampled
    step_seconds: float = 0.0  # time in the model's forward passes, all steps together
    last_step_s: float = 0.0  # the latest step's forward pass

    def count(
        self, batch: Sequence[tuple[Any, int]], prefills: list[bool], sampled: int, took_s: float
    ) -> None:
        """A step of `batch` ((sequence, tokens) each; `prefills`: whether each prefilled)
        that sampled `sampled` tokens in `took_s` seconds."""
        self.num_steps += 1
        self.num_generated_tokens += sampled
        self.step_seconds += took_s
        self.last_step_s = took_s
        for (_, n), prefilled in zip(batch, prefills, strict=True):
            # a decode step feeds back one sampled token; everything else is prefill
            if prefilled:
                self.num_prefill_tokens += n
            else:
                self.num_decode_tokens += n
