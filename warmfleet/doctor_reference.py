"""`warmfleet doctor`'s reference check: the model on the device under test against the CPU
float32 engine, on a fixed prompt, greedy.

Logits: the device's logits at every continuation position (fed the reference's tokens)
must be within LOGIT_TOL[dtype] of the reference's, every vocabulary entry.
Tokens: the device's greedy tokens (through the engine) must equal the reference's, or be
equal up to a first divergence at a near-tie: a position where the reference scores the
device's token within 2 x LOGIT_TOL of its own choice. Two logits each off by at most the
tolerance can swap order only then; after a divergence the contexts differ, so the tokens
that follow are not compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine import Engine
from engine.kv.kv_pool import BLOCK_TOKENS
from engine.model import Model
from engine.sequence import Request
from engine.step import Segment

# float32: the project's tolerance against transformers' float32 reference (tests/
# test_reference.py). float16: 11 significant bits put a logit near 20 within +-0.008 by
# its own rounding, and 30 layers of float16 residuals compound it: NumPy float16 (float32
# sums in the matmuls, as cuBLAS does, and in the RMS norm) was 0.056 off at worst on PROMPT,
# 0.095 on a chat prompt (24 positions x 49,152 logits, mean 0.0125); 0.25 leaves 2.5x that,
# still below most top-2 gaps (median ~1.5).
LOGIT_TOL = {"float32": 2e-3, "float16": 0.25}
PROMPT = "The history of computing is a story of layers: each generation of engineers"
NUM_TOKENS = 16


@dataclass(frozen=True, slots=True)
class Comparison:
    """The device against the reference on one prompt (see the module's rule)."""

    max_abs_diff: float  # over every position and vocabulary entry (inf if not finite)
    worst_position: int
    num_tokens: int
    divergence: int | None  # the first position whose greedy tokens differ
    tie_gap: float | None  # there: reference logit of its token minus of the device's
    tol: float

    @property
    def logits_ok(self) -> bool:
        return self.max_abs_diff <= self.tol

    @property
    def tokens_ok(self) -> bool:
        return self.divergence is None or (self.tie_gap is not None
                                           and self.tie_gap <= 2 * self.tol)  # fmt: skip

    @property
    def passed(self) -> bool:
        return self.logits_ok and self.tokens_ok

    def describe(self) -> str:
        line = (f"logits max |diff| {self.max_abs_diff:.2g} (tol {self.tol:g}) at position "
                f"{self.worst_position}; greedy ")  # fmt: skip
        if self.divergence is None:
            return line + f"{self.num_tokens}/{self.num_tokens} tokens identical"
        near = "a near-tie" if self.tokens_ok else "not a near-tie"
        return line + (f"identical up to position {self.divergence}, where the reference's "
                       f"gap is {self.tie_gap:.3g} ({near}, limit {2 * self.tol:g})")  # fmt: skip


def compare(
    ref_logits: np.ndarray,
    dev_logits: np.ndarray,
    ref_tokens: Sequence[int],
    dev_tokens: Sequence[int],
    tol: float,
) -> Comparison:
    """Logits [N, vocab] of both at the same N positions (fed the reference's tokens) and
    each side's N greedy tokens."""
    diff = np.abs(dev_logits.astype(np.float64) - ref_logits.astype(np.float64))
    diff[~np.isfinite(diff)] = np.inf  # a NaN anywhere fails, whatever the tolerance
    per_position = diff.max(axis=1)
    k = next((i for i, (a, b) in enumerate(zip(ref_tokens, dev_tokens, strict=True)) if a != b),
             None)  # fmt: skip
    gap = None
    if k is not None:
        gap = float(ref_logits[k, ref_tokens[k]]) - float(ref_logits[k, dev_tokens[k]])
    return Comparison(float(per_position.max()), int(per_position.argmax()), len(ref_tokens),
                      k, gap, tol)  # fmt: skip


def step_logits(model: Model, prompt_ids: list[int], num_tokens: int,
                feed: Sequence[int] | None = None) -> tuple[list[int], np.ndarray]:  # fmt: skip
    """One prefill of the prompt, then one token per step: the tokens fed back (greedy, the
    end-of-turn tokens never picked; or `feed`'s) and the logits [num_tokens, vocab] (host
    float32) each step gave."""
    n = len(prompt_ids) + num_tokens + BLOCK_TOKENS
    pool = model.new_pool(n * model.bytes_per_token)
    kv = pool.new_kv()
    eot = sorted(model.tokenizer.eot_ids)
    ids, tokens, rows = list(prompt_ids), [], []
    for i in range(num_tokens):
        start = kv.offset
        kv.prepare_write(start, len(ids))
        positions = list(range(start, start + len(ids)))
        logits = model.run(pool, ids, positions, [Segment(kv, start, len(ids), True)])
        kv.commit(ids)
        row = logits[0]
        rows.append(row)
        picked = row.copy()
        picked[eot] = -np.inf
        ids = [int(feed[i]) if feed is not None else int(np.argmax(picked))]
        tokens += ids
    kv.release()
    return tokens, np.stack(rows)


def engine_greedy(model: Model, prompt_ids: list[int], num_tokens: int) -> list[int]:
    """The engine's greedy tokens (end-of-turn tokens never picked), as a worker makes them."""
    room = (len(prompt_ids) + num_tokens + BLOCK_TOKENS) * model.bytes_per_token
    engine = Engine(model, EngineConfig(session_budget_bytes=0, kv_pool_bytes=room))
    request = Request("doctor", prompt_ids, SamplingParams(max_tokens=num_tokens, ignore_eos=True))
    return [t for out in engine.generate([request])["doctor"] for t in out.token_ids]


def check_against(reference: Model, model: Model, dtype: str) -> Comparison:
    """`model` (the device under test) against `reference` on PROMPT, with dtype's tolerance."""
    ids = reference.tokenizer.encode(PROMPT)
    ref_tokens, ref_logits = step_logits(reference, ids, NUM_TOKENS)
    _, dev_logits = step_logits(model, ids, NUM_TOKENS, feed=ref_tokens)
    dev_tokens = engine_greedy(model, ids, NUM_TOKENS)
    return compare(ref_logits, dev_logits, ref_tokens, dev_tokens, LOGIT_TOL[dtype])
