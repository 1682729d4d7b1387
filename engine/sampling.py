"""Sampling parameters (checked when built) and the per-token sampler."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

import numpy as np

from warmfleet.errors import InvalidRequestError

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
SEED_LIMIT = 2**63
# Without top-k, only tokens within this many nats of the best (after temperature) are
# candidates: the rest have probability below e^-30 of the best one's.
CANDIDATE_WINDOW_NATS = 30.0


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


def make_rng(seed: int | None) -> tuple[np.random.Generator, int]:
    """A generator private to one request, and the seed it was built from."""
    used = secrets.randbits(63) if seed is None else seed
    return np.random.Generator(np.random.PCG64(used)), used


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """One token id from a row of logits [vocab]. Each call draws exactly one number from
    `rng` (none when greedy), so a seeded request's tokens do not depend on its batch."""
    if params.greedy:
        return int(np.argmax(logits))
    x = logits.astype(np.float64) / params.temperature
    if 0 < params.top_k < x.shape[0]:
        ids = np.sort(np.argpartition(-x, params.top_k - 1)[: params.top_k])
    else:
        ids = np.flatnonzero(x >= x.max() - CANDIDATE_WINDOW_NATS)
    order = np.argsort(-x[ids], kind="stable")  # ties go to the lower id
    ids, vals = ids[order], x[ids][order]
    probs = np.exp(vals - vals[0])
    probs /= probs.sum()
    keep = len(probs)
    if params.top_p < 1.0:
        keep = min(keep, int(np.searchsorted(np.cumsum(probs), params.top_p)) + 1)
    if params.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(probs >= params.min_p * probs[0])))
    cdf = np.cumsum(probs[:keep])
    pick = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(ids[min(pick, keep - 1)])
