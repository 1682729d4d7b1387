"""The C attention kernel for decode rows against the Numba one (its fallback) and
against a dense NumPy softmax, on random keys scattered over a paged pool."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from engine.ops import native
from engine.ops.attention import AttentionPlan, paged_attention
from engine.ops.attention_rows import RowsKernel, kernel_row_limit, paged_rows, rows_kernel
from engine.ops.chunks import SMALL_ROWS, kernel_attention_rows

H, HKV, D, BLOCK = 9, 3, 64, 16
NUM_BLOCKS = 300


def dense(q: np.ndarray, k: np.ndarray, v: np.ndarray, table: np.ndarray, n: int) -> np.ndarray:
    """One row's attention in float64: [H, D]."""
    keys = k[table].transpose(1, 0, 2, 3).reshape(HKV, -1, D)[:, :n].astype(np.float64)
    values = v[table].transpose(1, 0, 2, 3).reshape(HKV, -1, D)[:, :n].astype(np.float64)
    qg = q.reshape(HKV, H // HKV, D).astype(np.float64)
    scores = qg @ keys.transpose(0, 2, 1) * D**-0.5  # [Hkv, G, n]
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ values).reshape(H, D)


@pytest.fixture(scope="module")
def pool() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    shape = (NUM_BLOCKS, HKV, BLOCK, D)
    return (rng.standard_normal(shape).astype(np.float32) * 2,
            rng.standard_normal(shape).astype(np.float32))  # fmt: skip


@pytest.mark.parametrize("lengths", [[1], [17, 16, 15], [1000, 33, 250, 999, 64, 2, 400, 640]])
def test_kernels_match_a_dense_softmax_and_each_row_is_alone(
    pool: tuple[np.ndarray, np.ndarray], lengths: list[int]
) -> None:
    k, v = pool
    rng = np.random.default_rng(len(lengths))
    rows = len(lengths)
    q = rng.standard_normal((rows, H, D)).astype(np.float32)
    width = max((n + BLOCK - 1) // BLOCK for n in lengths)
    tables = np.stack([rng.permutation(NUM_BLOCKS)[:width] for _ in lengths]).astype(np.int32)
    lens = np.asarray(lengths, dtype=np.int32)
    kernels: list[RowsKernel] = [rows_kernel(), paged_rows]
    assert native.library() is None or kernels[0] is not paged_rows  # C where it builds
    for kernel in kernels:
        out = np.empty((rows, H, D), dtype=np.float32)
        kernel(q, k, v, tables, lens, D**-0.5, out)
        for r, n in enumerate(lengths):
            np.testing.assert_allclose(out[r], dense(q[r], k, v, tables[r], n), atol=2e-5)
            alone = np.empty((1, H, D), dtype=np.float32)
            kernel(q[r : r + 1], k, v, tables[r : r + 1], lens[r : r + 1], D**-0.5, alone)
            assert np.array_equal(alone[0], out[r])


def test_long_chunks_through_the_kernel_equal_the_gather_path(
    pool: tuple[np.ndarray, np.ndarray],
) -> None:
    # a step of a decode row, a 300-row chunk at positions 200..499 and a 40-row one from 0:
    # every row through the compiled kernel (no row limit, as with the C kernels) against
    # long chunks gathered and attended with BLAS (the Numba fallback's and CuPy's path)
    k, v = pool
    rng = np.random.default_rng(9)
    segments = [(rng.permutation(NUM_BLOCKS)[:32].tolist(), start, n)
                for start, n in ((500, 1), (200, 300), (0, 40))]  # fmt: skip
    q = rng.standard_normal((341, H, D)).astype(np.float32)
    through_kernel = AttentionPlan.build(segments, None, compiled=True)
    assert len(through_kernel.kernel_rows) == 341 and not through_kernel.chunks
    assert (through_kernel.tables[1:301] == segments[1][0]).all()
    gathered = AttentionPlan.build(segments, 32, compiled=True)
    assert [c[:3] for c in gathered.chunks] == [(1, 300, 200), (301, 40, 0)]
    got = paged_attention(q, k, v, through_kernel, np)
    want = paged_attention(q, k, v, gathered, np)
    np.testing.assert_allclose(got, want, atol=2e-5)
    np.testing.assert_array_equal(got[:1], want[:1])  # the decode row: the kernel both times
    row = 1 + 123  # chunk row 123: position 323 sees 324 keys
    expected = dense(q[row], k, v, np.asarray(segments[1][0]), 324)
    np.testing.assert_allclose(got[row].reshape(H, D), expected, atol=2e-5)


def test_with_avx512_kernels_every_chunk_goes_to_the_kernel_unless_its_heads_do_not_fit() -> None:
    if native.library() is not None and native.wide_vectors():
        assert kernel_row_limit(H, HKV, D) is None
    elif native.library() is not None:  # AVX2 every chunk, NEON its products' bound
        assert kernel_row_limit(H, HKV, D) == kernel_attention_rows()
        assert (kernel_attention_rows() is None) == native.builds_for("avx2")
    else:  # the Numba fallback: BLAS beyond SMALL_ROWS, as for the products
        assert kernel_row_limit(H, HKV, D) == SMALL_ROWS
    assert kernel_row_limit(H, HKV, 40) == SMALL_ROWS  # D not a multiple of 16
    assert kernel_row_limit(34, 2, D) == SMALL_ROWS  # 17 query heads per KV head


@pytest.mark.parametrize("chunk", [2, 4, 5, 9])
def test_a_chunks_rows_together_equal_each_row_alone(
    pool: tuple[np.ndarray, np.ndarray], chunk: int
) -> None:
    # a decode row, then `chunk` rows of one sequence at positions 700.. (one table, so the
    # C kernel walks them in runs, a block at a time for several rows), then another
    # decode row whose length happens to follow the chunk's last: bit for bit each row
    # alone, the batch-invariance the engine relies on
    k, v = pool
    rng = np.random.default_rng(chunk)
    tables, lengths = [rng.permutation(NUM_BLOCKS)[:50]], [300]
    shared = rng.permutation(NUM_BLOCKS)[:50]
    tables += [shared] * chunk
    lengths += list(range(701, 701 + chunk))
    tables.append(rng.permutation(NUM_BLOCKS)[:50])
    lengths.append(701 + chunk)
    table = np.stack(tables).astype(np.int32)
    lens = np.asarray(lengths, dtype=np.int32)
    q = rng.standard_normal((len(lengths), H, D)).astype(np.float32)
    kernel = rows_kernel()
    out = np.empty_like(q)
    kernel(q, k, v, table, lens, D**-0.5, out)
    for r in range(len(lengths)):
        alone = np.empty((1, H, D), dtype=np.float32)
        kernel(q[r : r + 1], k, v, table[r : r + 1], lens[r : r + 1], D**-0.5, alone)
        assert np.array_equal(alone[0], out[r]), f"row {r}"
    row = 1 + chunk - 1
    expected = dense(q[row], k, v, shared, 700 + chunk)
    np.testing.assert_allclose(out[row], expected, atol=2e-5)


@pytest.mark.parametrize("heads", [(32, 8, 128), (16, 2, 128), (8, 8, 64), (14, 2, 64),
                                   (4, 4, 64), (12, 4, 48)], ids=str)  # fmt: skip
def test_each_task_shape_gives_a_row_its_bits_alone(heads: tuple[int, int, int]) -> None:
    # the kernel's three task shapes (a run of a chunk's rows per KV head, one row per KV
    # head, a whole row) for the head layouts it is compiled for, and one it is not
    # (D = 48): a row's bits must not depend on which one computed it
    num_heads, hkv, d = heads
    rng = np.random.default_rng(d + num_heads)
    k, v = (rng.standard_normal((120, hkv, BLOCK, d)).astype(np.float32) for _ in range(2))
    shared = rng.permutation(120)[:60]
    tables = [rng.permutation(120)[:60]] + [shared] * 6 + [rng.permutation(120)[:60]]
    lengths = [300, *range(501, 507), 507]
    table, lens = np.stack(tables).astype(np.int32), np.asarray(lengths, dtype=np.int32)
    q = rng.standard_normal((len(lengths), num_heads, d)).astype(np.float32)
    kernel = rows_kernel()
    alone = np.empty_like(q)
    for r in range(len(lengths)):
        kernel(q[r : r + 1], k, v, table[r : r + 1], lens[r : r + 1], d**-0.5, alone[r : r + 1])
    together, decode_rows = np.empty_like(q), np.empty_like(q)
    kernel(q, k, v, table, lens, d**-0.5, together)  # the chunk's rows in runs
    lens_apart = lens + np.arange(len(lengths), dtype=np.int32) % 2  # no runs: whole rows
    kernel(q, k, v, table, lens_apart, d**-0.5, decode_rows)
    for r in range(len(lengths)):
        assert np.array_equal(alone[r], together[r]), f"row {r} in a run"
        if lens_apart[r] == lens[r]:
            assert np.array_equal(alone[r], decode_rows[r]), f"row {r} as a whole row"


@pytest.mark.parametrize("heads", [(9, 3, 64), (8, 1, 64), (16, 2, 128), (14, 2, 64),
                                   (12, 4, 48), (32, 8, 128)], ids=str)  # fmt: skip
@pytest.mark.parametrize("threads", [2, 3, 5])
def test_a_long_row_spread_over_the_threads_keeps_its_bits(
    heads: tuple[int, int, int], threads: int
) -> None:
    # a long row alone, on threads its (row, KV head) tasks would not keep busy (decode at
    # batch 1), is split over all of them in phases: its bits must be those it gets among
    # other rows (one task per KV head, or whole rows), whatever the number of threads
    lib = native.library()
    if lib is None:
        pytest.skip("the C kernels do not build here")
    fn = lib.wf_paged_rows
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, p, p, p, i64, p, i64, i64, i64, i64, ctypes.c_float, p, ctypes.c_int]
    fn.restype = ctypes.c_int64  # 0, or the scratch bytes it could not allocate
    num_heads, hkv, d = heads
    rng = np.random.default_rng(num_heads * d + threads)
    k, v = (rng.standard_normal((160, hkv, BLOCK, d)).astype(np.float32) for _ in range(2))
    lengths = [2500, 1024, 1500, 1999]  # the first alone, then all four
    tables = np.stack([rng.permutation(160)[:157] for _ in lengths]).astype(np.int32)
    lens = np.asarray(lengths, dtype=np.int32)
    q = rng.standard_normal((len(lengths), num_heads, d)).astype(np.float32)

    def run(rows: int, num_threads: int) -> np.ndarray:
        out = np.full((rows, num_heads, d), np.nan, dtype=np.float32)
        pointers = [a.ctypes.data for a in (q, k, v, tables)]
        assert fn(*pointers, 157, lens.ctypes.data, rows, num_heads, hkv, d, d**-0.5,
                  out.ctypes.data, num_threads) == 0  # fmt: skip
        return out

    together = run(len(lengths), 2)
    for alone in (run(1, threads), run(1, 1)):
        assert np.array_equal(alone[0], together[0])
    keys = k[tables[0]].transpose(1, 0, 2, 3).reshape(hkv, -1, d)[:, :2500].astype(np.float64)
    values = v[tables[0]].transpose(1, 0, 2, 3).reshape(hkv, -1, d)[:, :2500].astype(np.float64)
    scores = q[0].reshape(hkv, -1, d).astype(np.float64) @ keys.transpose(0, 2, 1) * d**-0.5
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(together[0], (weights @ values).reshape(num_heads, d), atol=2e-5)
