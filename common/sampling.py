"""How a request wants its tokens picked: checked when built, shared by every layer (the
gateway builds it, Redis carries it, the engine samples with it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from common.errors import InvalidRequestError

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
SEED_LIMIT = 2**63


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each token. temperature 0 is greedy; top_k 0 and top_p 1 are off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = field(default=())
    ignore_eos: bool = False  # the end-of-turn tokens are never sampled: max_tokens are made
    min_tokens: int = 0  # the end-of-turn tokens are not sampled before this many tokens

    def __post_init__(self) -> None:
        t = self.temperature
        if not (math.isfinite(t) and t >= 0):
            raise InvalidRequestError("temperature", f"must be a finite number >= 0, got {t}")
        if self.top_k < 0:
            raise InvalidRequestError("top_k", f"must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p}")
        if not (0.0 <= self.min_p <= 1.0):
            raise InvalidRequestError("min_p", f"must be in [0, 1], got {self.min_p}")
        if self.seed is not None and not (0 <= self.seed < SEED_LIMIT):
            raise InvalidRequestError("seed", f"must be in [0, 2^63), got {self.seed}")
        if self.max_tokens < 1:
            raise InvalidRequestError("max_tokens", f"must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidRequestError(
                "min_tokens", f"must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError("stop", f"at most {MAX_STOP_STRINGS} stop strings")
        for s in self.stop:
            if not s or len(s) > MAX_STOP_CHARS:
                raise InvalidRequestError(
                    "stop", f"each stop string must have 1 to {MAX_STOP_CHARS} characters"
                )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
