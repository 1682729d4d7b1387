"""Bitwise batch invariance, checked the same way on the tiny models and the real one.

A step runs some decode rows (one new token for each of several prefilled sequences, in a
given order) and, optionally, a prefill chunk of a fresh sequence. Every row's logits must
equal, bit for bit, the logits of the same row run alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.model import Model
from tests.paged import new_kv, step


@dataclass(frozen=True)
class Composition:
    order: tuple[int, ...]  # which decode rows, in this order
    prefill: int = 0  # tokens of a prefill chunk run in the same step (0: none)
    prefill_first: bool = False  # the chunk's rows before the decode rows


def compositions(num_rows: int, sizes: list[int], prefills: list[int]) -> list[Composition]:
    """For each batch size, the rows rotated so that each run puts them in other positions,
    beside each prefill length in turn (and once before the decode rows)."""
    out = []
    for i, size in enumerate(sizes):
        order = tuple((i * 7 + j) % num_rows for j in range(size))
        prefill = prefills[i % len(prefills)]
        out.append(Composition(order, prefill, prefill_first=prefill > 0 and i % 4 == 3))
    return out


def check(model: Model, prompts: list[list[int]], cases: list[Composition]) -> int:
    """Assert every row of every case equals its run alone; returns the rows compared."""
    caches = []
    for ids in prompts:
        cache = new_kv(model)
        step(model, [(cache, ids[:-1])])
        cache.commit(ids[:-1])
        caches.append(cache)
    nexts = [ids[-1:] for ids in prompts]
    alone = [step(model, [(caches[i], nexts[i])])[0] for i in range(len(prompts))]
    chunk_ids = [3 + (7 * i) % (model.config.vocab_size - 3) for i in range(64)]
    chunk_alone = {n: step(model, [(new_kv(model), chunk_ids[:n])])[0] for n in
                   {c.prefill for c in cases if c.prefill}}  # fmt: skip
    compared = 0
    for case in cases:
        parts = [(caches[i], nexts[i]) for i in case.order]
        if case.prefill:
            chunk = (new_kv(model), chunk_ids[: case.prefill])
            parts = [chunk, *parts] if case.prefill_first else [*parts, chunk]
        logits = step(model, parts)
        rows = list(case.order)
        got = list(logits[1:] if case.prefill_first else logits[: len(rows)])
        for row, seq in zip(got, rows, strict=True):
            assert np.array_equal(row, alone[seq]), (case, seq, np.abs(row - alone[seq]).max())
            compared += 1
        if case.prefill:
            row = logits[0] if case.prefill_first else logits[-1]
            assert np.array_equal(row, chunk_alone[case.prefill]), case
            compared += 1
    return compared


def check_random_prompts(model: Model, lowest_id: int = 3) -> None:
    """16 random prompts of 2-39 tokens (ids from lowest_id on), decoded in batches of 1,
    5, 16 and 9 rows beside no chunk, a short one and a long one: every row as alone."""
    rng = np.random.default_rng(11)
    vocab = model.config.vocab_size
    prompts = [
        [int(t) for t in rng.integers(lowest_id, vocab, size=int(rng.integers(2, 40)))]
        for _ in range(16)
    ]
    cases = compositions(16, [1, 5, 16, 9], [0, 5, 40])
    assert check(model, prompts, cases) == sum(len(c.order) + (c.prefill > 0) for c in cases)
