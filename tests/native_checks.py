"""The all-layers C call against the family's layer run op by op, on any model whose shape
the call takes: the same logits and the same keys and values written to the pool, for decode
rows, a short chunk and a long one in one step (as long as the call takes: see
long_chunks_in_one_call)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from engine.model import Model
from engine.ops.chunks import SMALL_ROWS, kernel_chunk_rows
from engine.ops.native_layers import NativeLayers, native_layers
from tests.paged import new_kv, pool_of, run_segments, step


def long_chunks_in_one_call(model: Model, rows: int = 45) -> bool:
    """Whether the all-layers call takes a chunk of `rows` (longer than SMALL_ROWS): where
    the kernels take chunks that long (every one on AVX-512, 128 rows on AVX2:
    engine/ops/chunks.py), or every matrix of the model is read in place (an MoE model's);
    elsewhere (NEON, plain C) such a chunk goes to BLAS op by op."""
    limit = kernel_chunk_rows()
    return model.weights.in_place or limit is None or rows <= limit


def recorded(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each step from now takes the one-call path."""
    taken: list[bool] = []
    run: Callable[..., bool] = NativeLayers.run

    def spy(*args: Any) -> bool:
        taken.append(run(*args))
        return taken[-1]

    monkeypatch.setattr(NativeLayers, "run", spy)
    return taken


def assert_one_call_equals_per_op(
    model: Model, monkeypatch: pytest.MonkeyPatch, lowest_id: int = 0
) -> None:
    """One step of mixed rows run both ways from the same pool: equal bits. Token ids are
    drawn from [lowest_id, vocabulary)."""
    assert isinstance(native_layers(model.weights, model.config), NativeLayers)
    rng = np.random.default_rng(2)

    def ids(n: int) -> list[int]:
        return [int(t) for t in rng.integers(lowest_id, model.config.vocab_size, size=n)]

    kvs = [new_kv(model) for _ in range(3)]
    for kv in kvs:  # sequences with 20-50 positions already held
        run_segments(model, [(kv, ids(20))])
    run_segments(model, [(kvs[0], ids(30))])
    long_chunk = ids(45 if long_chunks_in_one_call(model) else SMALL_ROWS)
    parts = [(kvs[0], [7]), (new_kv(model), long_chunk), (kvs[1], [9, 11, 13]), (kvs[2], [5])]
    pool = pool_of(model)
    before = pool.k.copy(), pool.v.copy()

    model.weights.native = False  # the per-op loop
    per_op = step(model, parts)
    written = pool.k.copy(), pool.v.copy()
    pool.k[...], pool.v[...] = before
    model.weights.native = None  # one call, built again
    taken = recorded(monkeypatch)
    one_call = step(model, parts)

    assert taken == [True], "the step did not take the one-call path"
    assert np.array_equal(per_op, one_call), np.abs(per_op - one_call).max()
    # as bytes: the same for any KV dtype (q8_0's blocks are structured)
    assert written[0].tobytes() == pool.k.tobytes() and written[1].tobytes() == pool.v.tobytes()
    assert not np.array_equal(before[0], pool.k)  # the step did write its keys
