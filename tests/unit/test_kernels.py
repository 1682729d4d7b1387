"""The Numba few-row matmul equals BLAS for every row count and shape it may see."""

from __future__ import annotations

import numpy as np
import pytest

from engine.kernels import SMALL_ROWS, matmul_t


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 13, 16, SMALL_ROWS, SMALL_ROWS + 1])
@pytest.mark.parametrize(("n", "k"), [(960, 576), (64, 128), (12, 1536)])
def test_matmul_t_equals_blas(rows: int, n: int, k: int) -> None:
    rng = np.random.default_rng(rows * 1000 + n)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    got = matmul_t(x, w)
    assert got.shape == (rows, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-4, atol=1e-4)


def test_odd_row_count_and_views_fall_back_or_match() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((265, 64)).astype(np.float32)  # 265 % 4 != 0: BLAS path
    x = rng.standard_normal((8, 128)).astype(np.float32)[:, ::2]  # a strided view
    np.testing.assert_allclose(matmul_t(x, w), x @ w.T, rtol=1e-5, atol=1e-5)
    w4 = w[:264]
    np.testing.assert_allclose(matmul_t(x, w4), x @ w4.T, rtol=1e-4, atol=1e-4)
