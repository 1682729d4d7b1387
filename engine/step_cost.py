"""How long a step takes, learned from the steps run: the basis of the per-step time budget.

A step costs about `base` (reading the weights once, plus one token per decoding sequence)
plus `per_token` for every prompt token it prefills. Both are running averages of what was
measured, so the budget follows the machine and the load.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_PREFILL_TOKENS = 16  # a long prompt always advances, even on a slow step
_SMOOTHING = 0.2


def _average(old: float | None, new: float) -> float:
    return new if old is None else old + _SMOOTHING * (new - old)


@dataclass(slots=True)
class StepCost:
    base_s: float | None = None
    per_token_s: float | None = None

    def observe(self, num_prefill: int, seconds: float) -> None:
        """One step's wall time and how many prompt tokens it prefilled."""
        if num_prefill == 0:
            self.base_s = _average(self.base_s, seconds)
        elif self.base_s is not None:
            extra = max(0.0, seconds - self.base_s) / num_prefill
            self.per_token_s = _average(self.per_token_s, extra)

    def prefill_tokens(self, budget_s: float, ceiling: int) -> int:
        """Prompt tokens that fit a step of `budget_s` beside the decodes (at most
        `ceiling`, at least MIN_PREFILL_TOKENS); `ceiling` until both costs are known."""
        if self.base_s is None or self.per_token_s is None or self.per_token_s <= 0:
            return ceiling
        fit = int((budget_s - self.base_s) / self.per_token_s)
        return max(MIN_PREFILL_TOKENS, min(ceiling, fit))
