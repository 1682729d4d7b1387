"""Qwen 3's per-head RMS norm of q and k (elementwise.head_rms_norm), in place on a step's
qkv [N, C]: the C loop, the NumPy expressions and the GPU kernel against float64, only
the columns asked for changed, and each row's bits the same alone as in any batch. The
GPU cases are skipped where CuPy sees no GPU (here)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.ops import native
from engine.ops.elementwise import head_rms_norm
from tests import cuda_emu

cp: Any = cuda_emu.cupy()  # on a machine without a GPU, its CPU stand-in
HEADS, KV_HEADS, D, EPS = 4, 2, 64, 1e-6
COLS = (HEADS + 2 * KV_HEADS) * D


def qkv_rows(n: int) -> np.ndarray:
    rng = np.random.default_rng(n)
    return (rng.standard_normal((n, COLS)) * 3).astype(np.float32)


WEIGHT = np.exp(0.6 * np.random.default_rng(1).standard_normal(D)).astype(np.float32)


def expected(qkv: np.ndarray, col0: int, heads: int) -> np.ndarray:
    """qkv with columns col0 .. col0 + heads * D normed head by head, in float64."""
    out = qkv.astype(np.float64)
    runs = out[:, col0 : col0 + heads * D].reshape(len(qkv), heads, D)
    runs = runs / np.sqrt((runs * runs).mean(-1, keepdims=True) + EPS) * WEIGHT
    out[:, col0 : col0 + heads * D] = runs.reshape(len(qkv), -1)
    return out


def normed(qkv: np.ndarray, path: str) -> np.ndarray:
    """A copy of qkv with q's heads then k's normed, as forward.py calls it, on `path`."""
    xp: Any = cp if path == "cuda" else np
    x: Any
    if path == "numpy":  # a non-contiguous qkv takes the NumPy expressions
        x = np.zeros((len(qkv), COLS + 16), dtype=np.float32)[:, :COLS]
        x[...] = qkv
    else:
        x = xp.array(qkv)
    w = xp.asarray(WEIGHT)
    head_rms_norm(x, 0, HEADS, D, w, EPS, xp)
    head_rms_norm(x, HEADS * D, KV_HEADS, D, w, EPS, xp)
    out: np.ndarray = x if xp is np else x.get()
    return out


@pytest.mark.parametrize("path", ["c", "numpy", "cuda"])
@pytest.mark.usefixtures("cuda_module")
def test_each_head_of_q_and_k_is_normed_and_v_is_left(path: str) -> None:
    if path == "c" and native.library() is None:
        pytest.skip("needs the C kernels")
    qkv = qkv_rows(9)
    got = normed(qkv, path)
    want = expected(expected(qkv, 0, HEADS), HEADS * D, KV_HEADS)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    assert np.array_equal(got[:, (HEADS + KV_HEADS) * D :], qkv[:, (HEADS + KV_HEADS) * D :])
    rows = [normed(qkv[r : r + 1], path)[0] for r in range(len(qkv))]
    assert np.array_equal(np.stack(rows), got)
