"""The GPU's layer kernels (engine/ops/gpu_ops.py: RMS norm, rope, SiLU * up, paged attention)
against float64 NumPy, and each row's bits the same whatever rows come with it; where no
GPU is found (CI) on the CPU stand-in (tests/cuda_emu). test_cuda_forward.py runs them
inside the forward pass."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.ops import gpu_ops
from tests import cuda_emu

cp: Any = cuda_emu.cupy()  # on a machine without a GPU, its CPU stand-in
pytestmark = pytest.mark.usefixtures("cuda_module")
BLOCK = 16


def rows_alone_equal_rows_together(run: Any, x: np.ndarray) -> np.ndarray:
    """run(x) for all rows at once; asserts each row has the bits it has alone."""
    together = cp.asnumpy(run(cp.asarray(x)))
    for r in range(len(x)):
        alone = cp.asnumpy(run(cp.asarray(x[r : r + 1])))
        assert np.array_equal(alone[0], together[r]), f"row {r}"
    return together


def test_rms_norm() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((7, 576)) * 3).astype(np.float32)
    w = rng.standard_normal(576).astype(np.float32)
    got = rows_alone_equal_rows_together(lambda a: gpu_ops.rms_norm(a, cp.asarray(w), 1e-5), x)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_rope_into_pool_writes_keys_and_values_where_write_layer_would() -> None:
    rng = np.random.default_rng(3)
    n, heads, hkv, d, num_blocks, layer = 6, 6, 2, 64, 5, 1
    qkv = rng.standard_normal((n, (heads + 2 * hkv) * d)).astype(np.float32)
    angles = np.arange(64)[:, None] * 10000.0 ** (-np.arange(0, d, 2) / d)[None, :]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    pos = np.array([0, 1, 2, 40, 41, 63], dtype=np.int64)
    blocks = np.array([3, 3, 3, 0, 0, 4], dtype=np.int64)
    slots = np.array([0, 1, 2, 8, 9, 15], dtype=np.int64)
    rows = ((blocks[:, None] * hkv + np.arange(hkv)) * BLOCK + slots[:, None]).reshape(-1)
    shift = layer * num_blocks * hkv * BLOCK  # as KVPool.flat_rows and row_shift
    shape = (2, num_blocks, hkv, BLOCK, d)
    k_pool, v_pool = cp.zeros(shape, cp.float32), cp.zeros(shape, cp.float32)
    q = gpu_ops.rope_into_pool(cp.asarray(qkv), heads, hkv, d, (cp.asarray(cos),
                               cp.asarray(sin)), cp.asarray(pos), cp.asarray(rows), shift,
                               k_pool, v_pool)  # fmt: skip

    def rotated(x: np.ndarray) -> np.ndarray:  # x: [n, h, D] float64
        c, s = cos[pos][:, None, :], sin[pos][:, None, :]
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)

    x = qkv.astype(np.float64).reshape(n, heads + 2 * hkv, d)
    np.testing.assert_allclose(cp.asnumpy(q), rotated(x[:, :heads]), rtol=0, atol=1e-5)
    want_k, want_v = np.zeros(shape), np.zeros(shape)
    want_k.reshape(-1, d)[rows + shift] = rotated(x[:, heads : heads + hkv]).reshape(-1, d)
    want_v.reshape(-1, d)[rows + shift] = x[:, heads + hkv :].reshape(-1, d)
    np.testing.assert_allclose(cp.asnumpy(k_pool), want_k, rtol=0, atol=1e-5)
    assert np.array_equal(cp.asnumpy(v_pool), want_v.astype(np.float32))  # copied as they are


def test_silu_mul() -> None:
    gate_up = np.random.default_rng(2).standard_normal((6, 2 * 96)).astype(np.float32) * 4
    got = rows_alone_equal_rows_together(lambda a: gpu_ops.silu_mul(a, 96), gate_up)
    g, u = gate_up[:, :96].astype(np.float64), gate_up[:, 96:]
    np.testing.assert_allclose(got, g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)


def attention_reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    tables: np.ndarray,
    lengths: np.ndarray,
    window: int = 0,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """float64 attention of each row [H, D] over its first lengths[r] keys (the last
    `window` of them where window > 0; sinks[h] joining each softmax as a score with no
    value where given)."""
    n, heads, d = q.shape
    hkv = k.shape[1]
    out = np.empty((n, heads, d))
    for r in range(n):
        t = np.arange(max(0, lengths[r] - window) if window else 0, lengths[r])
        blocks, slots = tables[r, t // BLOCK], t % BLOCK
        for h in range(heads):
            keys = k[blocks, h // (heads // hkv), slots].astype(np.float64)  # [T, D]
            values = v[blocks, h // (heads // hkv), slots].astype(np.float64)
            s = keys @ q[r, h] / np.sqrt(d)
            top = s.max() if sinks is None else max(s.max(), float(sinks[h]))
            p = np.exp(s - top)
            total = p.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - top))
            out[r, h] = p @ values / total
    return out


def attention_case(
    rng: np.random.Generator, heads: int, hkv: int, d: int, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Random queries [R, H, D], a pool's keys and values [40, Hkv, B, D] and each row's
    table of distinct blocks, for rows of these lengths."""
    k, v = (rng.standard_normal((40, hkv, BLOCK, d)).astype(np.float32) for _ in "kv")
    width = -(-int(lengths.max()) // BLOCK)
    tables = np.stack([rng.permutation(40)[:width] for _ in lengths]).astype(np.int32)
    q = rng.standard_normal((len(lengths), heads, d)).astype(np.float32)
    return q, k, v, tables


@pytest.mark.parametrize(("heads", "hkv", "d"), [(9, 3, 64), (4, 4, 32), (8, 1, 128)])
def test_paged_attention_every_row_in_one_launch(heads: int, hkv: int, d: int) -> None:
    rng = np.random.default_rng(heads * d)
    lengths = np.array([1, 2, 5, 16, 17, 100, 333, 64, 3], dtype=np.int32)
    q, k, v, tables = attention_case(rng, heads, hkv, d, lengths)
    kg, vg = cp.asarray(k), cp.asarray(v)

    def run(rows: slice) -> np.ndarray:
        return cp.asnumpy(gpu_ops.paged_attention(
            cp.asarray(q[rows]), kg, vg, cp.asarray(tables[rows]), cp.asarray(lengths[rows]),
            d**-0.5))  # fmt: skip

    got = run(slice(None))
    for r in range(len(q)):  # each row has the bits it has alone
        assert np.array_equal(run(slice(r, r + 1))[0], got[r]), f"row {r}"
    want = attention_reference(q, k, v, tables, lengths)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


@pytest.mark.parametrize(("window", "with_sinks"), [(0, True), (7, False), (16, True), (128, True)])
def test_paged_attention_with_a_window_and_sinks(window: int, with_sinks: bool) -> None:
    """gpt-oss's limits in the same launch: only the last `window` keys read, each head's
    sink in its denominator; the bits of a row still its own."""
    rng = np.random.default_rng(window)
    heads, d = 8, 64
    lengths = np.array([1, 6, 7, 8, 16, 17, 100, 129, 333], dtype=np.int32)
    q, k, v, tables = attention_case(rng, heads, 2, d, lengths)
    sinks = (3 * rng.standard_normal(heads)).astype(np.float32) if with_sinks else None
    kg, vg = cp.asarray(k), cp.asarray(v)
    head_sinks = None if sinks is None else cp.asarray(sinks)

    def run(rows: slice) -> np.ndarray:
        tr, lr = cp.asarray(tables[rows]), cp.asarray(lengths[rows])
        qr = cp.asarray(q[rows])
        return cp.asnumpy(gpu_ops.paged_attention(qr, kg, vg, tr, lr, d**-0.5, window, head_sinks))

    got = run(slice(None))
    for r in range(len(q)):
        assert np.array_equal(run(slice(r, r + 1))[0], got[r]), f"row {r}"
    want = attention_reference(q, k, v, tables, lengths, window, sinks)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
