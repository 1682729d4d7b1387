"""Sliding windows and attention sinks (gpt-oss) in the attention kernels: the C kernel in
each of its task forms (a (row, KV head), whole rows, a chunk's runs, a long row split over
the threads), the Numba fallback and the gather path, against a float64 softmax; and each
row's bits its own whatever else the call holds."""

from __future__ import annotations

import numpy as np
import pytest

from engine.ops import native
from engine.ops.attention import AttentionPlan, paged_attention
from engine.ops.attention_rows import NO_SINKS, RowsKernel, paged_rows, rows_kernel

H, HKV, D, BLOCK = 8, 2, 64, 16
NUM_BLOCKS = 200
SINKS = np.array([-2.0, 0.0, 1.5, 3.0, -0.5, 0.7, 2.2, 8.0], dtype=np.float32)  # 8: dominates


def dense(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    table: np.ndarray,
    n: int,
    window: int,
    sinks: np.ndarray | None,
) -> np.ndarray:
    """One row's attention in float64 over keys (n - window, n]: [H, D]."""
    lo = n - window if 0 < window < n else 0
    keys = k[table].transpose(1, 0, 2, 3).reshape(HKV, -1, D)[:, lo:n].astype(np.float64)
    values = v[table].transpose(1, 0, 2, 3).reshape(HKV, -1, D)[:, lo:n].astype(np.float64)
    scores = q.reshape(HKV, H // HKV, D).astype(np.float64) @ keys.transpose(0, 2, 1) * D**-0.5
    top = scores.max(axis=-1, keepdims=True)
    sink = None if sinks is None else sinks.astype(np.float64).reshape(HKV, H // HKV, 1)
    if sink is not None:
        top = np.maximum(top, sink)
    p = np.exp(scores - top)
    total = p.sum(axis=-1, keepdims=True) + (0 if sink is None else np.exp(sink - top))
    return (p / total @ values).reshape(H, D)


@pytest.fixture(scope="module")
def pool() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    shape = (NUM_BLOCKS, HKV, BLOCK, D)
    return (
        rng.standard_normal(shape).astype(np.float32) * 2,
        rng.standard_normal(shape).astype(np.float32),
    )


def kernels() -> list[RowsKernel]:
    c = rows_kernel()
    assert native.library() is None or c is not paged_rows  # C where it builds
    return [c, paged_rows]


# rows: (table id, length); rows of one table at consecutive lengths are a chunk's run
CASES = {
    "one row, window inside a block": [(0, 300)],
    "few rows": [(0, 300), (1, 40), (2, 17)],
    "whole rows": [(i, n) for i, n in enumerate([5, 130, 200, 31, 64, 257, 129, 90])],
    "a chunk's runs": [(0, 100)] + [(1, n) for n in range(150, 159)] + [(2, 60)],
    "a long row split over threads": [(0, 1500)],
}


@pytest.mark.parametrize("window", [0, 20, 128])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_sinks", [True, False])
def test_windows_and_sinks_match_a_dense_softmax_and_each_row_is_alone(
    pool: tuple[np.ndarray, np.ndarray], window: int, case: str, with_sinks: bool
) -> None:
    k, v = pool
    rows = CASES[case]
    rng = np.random.default_rng(len(rows) + window)
    width = max(n for _, n in rows) // BLOCK + 1
    owned = {t: rng.permutation(NUM_BLOCKS)[:width] for t, _ in rows}
    tables = np.stack([owned[t] for t, _ in rows]).astype(np.int32)
    lens = np.asarray([n for _, n in rows], dtype=np.int32)
    q = rng.standard_normal((len(rows), H, D)).astype(np.float32)
    sinks = SINKS if with_sinks else NO_SINKS
    for kernel in kernels():
        out = np.empty((len(rows), H, D), dtype=np.float32)
        kernel(q, k, v, tables, lens, D**-0.5, out, window, sinks)
        for r, (_, n) in enumerate(rows):
            want = dense(q[r], k, v, tables[r], n, window, SINKS if with_sinks else None)
            np.testing.assert_allclose(out[r], want, atol=2e-5)
            alone = np.empty((1, H, D), dtype=np.float32)
            kernel(
                q[r : r + 1],
                k,
                v,
                tables[r : r + 1],
                lens[r : r + 1],
                D**-0.5,
                alone,
                window,
                sinks,
            )
            assert np.array_equal(alone[0], out[r]), (r, n)


def test_a_window_never_reads_the_blocks_it_has_left(pool: tuple[np.ndarray, np.ndarray]) -> None:
    """Blocks wholly before a row's window may be freed (their table entries anything):
    the kernels must not read them. Here they point past the pool's end."""
    k, v = pool
    rng = np.random.default_rng(3)
    n, window = 400, 128
    table = rng.permutation(NUM_BLOCKS)[: n // BLOCK + 1].astype(np.int32)
    first = (n - window) // BLOCK
    wild = table.copy()
    wild[:first] = 10**6
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    for kernel in kernels():
        want, got = (np.empty((1, H, D), dtype=np.float32) for _ in range(2))
        kernel(q, k, v, table[None], np.array([n], np.int32), D**-0.5, want, window, SINKS)
        kernel(q, k, v, wild[None], np.array([n], np.int32), D**-0.5, got, window, SINKS)
        assert np.array_equal(got, want)


def test_the_gather_path_applies_windows_and_sinks(pool: tuple[np.ndarray, np.ndarray]) -> None:
    """Long chunks gathered and attended with BLAS (the Numba fallback's path) against the
    same rows through the kernel."""
    k, v = pool
    rng = np.random.default_rng(11)
    segments = [
        (rng.permutation(NUM_BLOCKS)[:40].tolist(), start, n)
        for start, n in ((300, 1), (100, 200), (0, 70))
    ]
    q = rng.standard_normal((271, H, D)).astype(np.float32)
    through_kernel = AttentionPlan.build(segments, None, compiled=True)
    gathered = AttentionPlan.build(segments, 32, compiled=True)
    assert len(gathered.chunks) == 2
    for window in (0, 50):
        got = paged_attention(q, k, v, through_kernel, np, window, SINKS)
        want = paged_attention(q, k, v, gathered, np, window, SINKS)
        np.testing.assert_allclose(got, want, atol=2e-5)
        row = 1 + 150  # chunk row 150: position 250 sees 251 keys
        expected = dense(q[row], k, v, np.asarray(segments[1][0]), 251, window, SINKS)
        np.testing.assert_allclose(got[row].reshape(H, D), expected, atol=2e-5)


def test_the_gather_path_skips_the_blocks_a_chunk_has_left(
    pool: tuple[np.ndarray, np.ndarray],
) -> None:
    """A long chunk gathered for a windowed layer reads only the blocks its first row's
    window starts in and after: here the others point past the pool's end."""
    k, v = pool
    rng = np.random.default_rng(5)
    start, n, window = 300, 100, 64
    table = rng.permutation(NUM_BLOCKS)[: (start + n) // BLOCK + 1]
    wild = table.copy()
    wild[: (start + 1 - window) // BLOCK] = 10**6
    q = rng.standard_normal((n, H, D)).astype(np.float32)
    plans = [AttentionPlan.build([(t.tolist(), start, n)], 32, True) for t in (table, wild)]
    assert len(plans[0].chunks) == 1
    want, got = (paged_attention(q, k, v, plan, np, window, SINKS) for plan in plans)
    assert np.array_equal(got, want)
