"""Long chunks multiplied by BLAS from the C kernels' threads (engine/ops/csrc/blas_chunks.c):
each thread expands its share of the weight rows and calls the process's sgemm, held to one
thread, once per chunk. Against gguf's dequantization and a float64 product, every chunk's
bits its own whatever chunks come with it, the slabs of a large matrix, and the BLAS pool's
thread count (engine/ops/blas.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.ops import blas, kernels
from engine.ops.kernels import matmul_t, plan_rows
from engine.ops.quant import native
from tests.unit.quant_cases import TYPES, K, N, Stored, summation_bound, write_and_read

COMPILED = native.load()
pytestmark = pytest.mark.skipif(
    COMPILED is None or COMPILED.blas is None,
    reason="needs the C kernels and NumPy on OpenBLAS (the path does not exist without them)",
)
CHUNKS = ((0, 150), (150, 151), (151, 300))  # a long chunk, a single row, another long one


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Stored:
    return write_and_read(Path(tmp_path_factory.mktemp("blas")) / "types.gguf")


def blas_chunks(
    w: object, x: np.ndarray, chunks: tuple[tuple[int, int], ...], threads: int
) -> np.ndarray:
    assert COMPILED is not None and COMPILED.blas is not None
    n = w.shape[0]  # type: ignore[attr-defined]
    out = np.full((x.shape[0], n), np.nan, dtype=np.float32)
    slab = np.empty((n, K), dtype=np.float32)
    rows = np.arange(n, dtype=np.int64)
    COMPILED.blas(w, rows, x, np.array(chunks, np.int64), out, 0, slab, threads)  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_chunk_within_the_float32_bound_of_the_exact_product(
    stored: Stored, qtype: object
) -> None:
    matrix, w = stored[qtype]  # type: ignore[index]
    x = np.random.default_rng(int(qtype)).standard_normal((300, K)).astype(np.float32)  # type: ignore[call-overload]
    got = blas_chunks(matrix, x, CHUNKS, 2)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    assert (np.abs(got - exact) <= summation_bound(x, w)).all()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_chunks_bits_are_its_own_whatever_chunks_come_with_it(
    stored: Stored, threads: int
) -> None:
    matrix, _ = stored[TYPES[4]]  # Q8_0: the default model's
    x = np.random.default_rng(threads).standard_normal((300, K)).astype(np.float32)
    together = blas_chunks(matrix, x, CHUNKS, threads)
    for start, stop in CHUNKS:
        alone = blas_chunks(matrix, x[start:stop], ((0, stop - start),), threads)
        assert np.array_equal(together[start:stop], alone)


def calls_to_blas(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The process's kernels' BlasChunks calls from now on: whether each had a slab."""
    quant, calls = kernels.quant_kernels(), []
    real = quant.blas
    assert real is not None

    def counted(*args: Any) -> None:
        calls.append(args[6] is not None)
        real(*args)

    monkeypatch.setattr(quant, "blas", counted)
    return calls


def test_float32_weights_are_used_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """matmul_t's long chunks on float32 weights: no expansion, each chunk on its own."""
    calls = calls_to_blas(monkeypatch)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1 + 200 + 150, 64)).astype(np.float32)
    w = rng.standard_normal((N, 64)).astype(np.float32)
    runs = plan_rows([1, 200, 150])
    got = matmul_t(x, w, runs)
    assert np.array_equal(got[:1], matmul_t(x[:1], w))  # the kernel row
    np.testing.assert_allclose(got[1:], x[1:] @ w.T, rtol=1e-4, atol=1e-4)
    assert np.array_equal(got[1:201], matmul_t(x[1:201], w, plan_rows([200])))
    assert calls == [False, False]  # both chunks in one call, then the chunk alone; no slab


def test_quantized_slabs_land_in_their_columns(
    stored: Stored, monkeypatch: pytest.MonkeyPatch
) -> None:
    matrix, w = stored[TYPES[4]]
    calls = calls_to_blas(monkeypatch)
    # chunks past 128 rows to BLAS, as built for AVX2 (on AVX-512 the kernels take them all)
    monkeypatch.setattr(kernels.quant_kernels(), "chunk_rows", 128)
    x = np.random.default_rng(9).standard_normal((2 * 140, K)).astype(np.float32)
    runs = ((0, 140, False), (140, 280, False))
    exact, bound = x.astype(np.float64) @ w.T.astype(np.float64), summation_bound(x, w)
    assert (np.abs(kernels._quant_matmul(x, matrix, runs) - exact) <= bound).all()
    monkeypatch.setattr(kernels, "SCRATCH_BYTES", 4 * K * 8)  # 8 rows a slab: 5 slabs
    slabs = kernels._quant_matmul(x, matrix, runs)
    # within the bound, the same bits every time (not the whole matrix's: BLAS's kernel
    # treats the last columns of a call apart, and a slab's last are others)
    assert (np.abs(slabs - exact) <= bound).all()
    assert np.array_equal(kernels._quant_matmul(x, matrix, runs), slabs)
    assert calls == [True] * (1 + 5 + 5)  # the whole matrix, then 5 slabs twice


def test_blas_is_held_to_one_thread_once_the_kernels_call_it() -> None:
    pool, configured = blas.POOL, blas.POOL.configured
    assert pool.sgemm_for_kernels() is not None
    try:
        for n in (1, 2, 4):
            pool.configure(n)
            pool.use(pool.configured)
            assert pool._lib is not None and pool._lib.num_threads == 1
    finally:
        pool.configure(configured)
