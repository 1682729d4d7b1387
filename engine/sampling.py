"""The per-token sampler."""

from __future__ import annotations

import secrets

import numpy as np

from common.sampling import SamplingParams

# Without top-k, only tokens within this many nats of the best (after temperature) are
# candidates: the rest have probability below e^-30 of the best one's.
CANDIDATE_WINDOW_NATS = 30.0


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
