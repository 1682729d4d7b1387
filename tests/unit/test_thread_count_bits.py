"""Decode rows' logits are bit for bit the same whatever number of threads the kernels run
on: one, two, and three where the kernels may have three (MAX_THREADS, the cores), at batch
1 over a context long enough that attention spreads one row over every thread
(attention.c's row_split, from 1,024 keys) and at batch 4 (tasks taken from a shared
counter). A worker could then choose its threads step by step as the box's load changes
(bench/RESULTS.md, "Decode on a busy box") without its tokens changing."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from engine.device import set_threads
from engine.model import Model
from engine.ops.kernels import MAX_THREADS, get_num_threads
from tests.paged import new_kv, step

THREADS = tuple(range(1, min(3, MAX_THREADS) + 1))


@pytest.fixture
def restored_threads() -> Iterator[None]:
    before = get_num_threads()
    yield
    set_threads(before)


@pytest.mark.skipif(MAX_THREADS < 2, reason="the kernels have one thread on this machine")
@pytest.mark.parametrize("batch, length", [(1, 1100), (4, 300)])
def test_decode_rows_do_not_depend_on_the_thread_count(
    model: Model, restored_threads: None, batch: int, length: int
) -> None:
    rng = np.random.default_rng(batch)
    vocab = model.config.vocab_size
    prompts = [[int(t) for t in rng.integers(3, vocab, length + i)] for i in range(batch)]
    caches = []
    for ids in prompts:  # prefilled on the usual threads, but for the last token
        cache = new_kv(model)
        step(model, [(cache, ids[:-1])])
        cache.commit(ids[:-1])
        caches.append(cache)
    rows = [(cache, ids[-1:]) for cache, ids in zip(caches, prompts, strict=True)]
    got = {}
    for n in THREADS:  # the same decode step (its rows' keys written to the same slots)
        assert set_threads(n) == n and get_num_threads() == n  # what the forward pass reads
        got[n] = step(model, rows)
    for n in THREADS[1:]:
        assert np.array_equal(got[n], got[1]), (n, np.abs(got[n] - got[1]).max())
