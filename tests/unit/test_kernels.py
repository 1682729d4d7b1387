"""The row kernel equals BLAS up to rounding for every shape it may see, and gives each row
the same bits whatever rows come with it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from common.errors import InvalidRequestError
from engine.ops import kernels, native
from engine.ops.chunks import CHUNK_ROWS_ENV, kernel_attention_rows, kernel_chunk_rows
from engine.ops.kernels import SMALL_ROWS, matmul_t, plan_rows


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 13, 16, SMALL_ROWS, SMALL_ROWS + 1])
@pytest.mark.parametrize(("n", "k"), [(960, 576), (64, 128), (12, 1536), (265, 64)])
def test_matmul_t_equals_blas(rows: int, n: int, k: int) -> None:
    rng = np.random.default_rng(rows * 1000 + n)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    got = matmul_t(x, w)
    assert got.shape == (rows, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-4, atol=1e-4)
    blas_runs = matmul_t(x, w, plan_rows([rows]))
    np.testing.assert_allclose(blas_runs, x @ w.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [960, 265, 7])
def test_each_row_has_the_same_bits_alone_and_in_any_batch(n: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.standard_normal((SMALL_ROWS, 576)).astype(np.float32)
    w = rng.standard_normal((n, 576)).astype(np.float32)
    alone = np.concatenate([matmul_t(x[i : i + 1], w) for i in range(SMALL_ROWS)])
    for size in (2, 3, 5, 8, 17, SMALL_ROWS):
        for start in range(0, SMALL_ROWS - size + 1, 3):
            assert np.array_equal(matmul_t(x[start : start + size], w), alone[start : start + size])
    flipped = matmul_t(x[::-1], w)  # a strided view: every row in another position
    assert np.array_equal(flipped[::-1], alone)


def test_runs_compute_kernel_and_blas_rows_apart() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1 + 40 + 2, 64)).astype(np.float32)
    w = rng.standard_normal((24, 64)).astype(np.float32)
    runs = plan_rows([1, 40, 2])
    got = matmul_t(x, w, runs)
    assert np.array_equal(got[:1], matmul_t(x[:1], w))
    assert np.array_equal(got[41:], matmul_t(x[41:], w))
    assert np.array_equal(got[1:41], x[1:41] @ w.T)  # the long chunk: BLAS, on its own


@pytest.mark.parametrize(
    ("limit", "want"),
    [
        (None, ((0, 245, True),)),  # AVX-512: every chunk in the kernels, one run
        (128, ((0, 44, True), (44, 244, False), (244, 245, True))),  # AVX2
        (
            SMALL_ROWS,
            ((0, 1, True), (1, 41, False), (41, 44, True), (44, 244, False), (244, 245, True)),
        ),
    ],
)
def test_quantized_kernels_take_the_long_chunks_their_build_allows(
    limit: int | None, want: tuple[tuple[int, int, bool], ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """plan_rows sends every chunk past SMALL_ROWS to BLAS (as float weights want);
    kernel_runs gives the quantized kernels those they take (engine/ops/chunks.py), merged
    with the kernel rows beside them."""
    monkeypatch.setattr(kernels, "quant_kernels", lambda: SimpleNamespace(chunk_rows=limit))
    assert kernels.kernel_runs(plan_rows([1, 40, 3, 200, 1])) == want


def test_on_x86_the_attention_kernel_takes_every_chunk_whatever_the_products_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """WARMFLEET_CHUNK_ROWS bounds the products; the attention kernel takes every chunk on
    AVX-512 and AVX2 builds (faster than gathering there at every length) and follows the
    products' bound elsewhere."""
    monkeypatch.setenv(CHUNK_ROWS_ENV, "64")
    x86 = native.wide_vectors() or native.builds_for("avx2")
    assert kernel_chunk_rows() == 64
    assert kernel_attention_rows() == (None if x86 else 64)


def test_warmfleet_chunk_rows_sets_the_bound_on_any_build(monkeypatch: pytest.MonkeyPatch) -> None:
    for asked, rows in (("64", 64), (" ALL ", None), (str(SMALL_ROWS), SMALL_ROWS)):
        monkeypatch.setenv(CHUNK_ROWS_ENV, asked)
        assert kernel_chunk_rows() == rows
    for bad in ("0", "-3", "many", "1.5", str(SMALL_ROWS - 1)):
        monkeypatch.setenv(CHUNK_ROWS_ENV, bad)
        with pytest.raises(InvalidRequestError, match=CHUNK_ROWS_ENV):
            kernel_chunk_rows()
