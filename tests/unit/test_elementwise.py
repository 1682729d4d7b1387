"""The layer's elementwise steps in C against their NumPy expressions, and each row the
same alone as in any batch."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from engine.kv_files.kv_dtypes import NAMES, Q8_0, quantize, row_items
from engine.ops import native
from engine.ops.elementwise import _compiled, put_kv_rows, rms_norm, rope, silu_mul

RNG = np.random.default_rng(11)


def test_the_c_path_is_taken_where_the_kernels_build() -> None:
    """The tests below hold for the NumPy expressions too; this one says which ran."""
    x = np.zeros((2, 64), dtype=np.float32)
    assert (_compiled(x, multiple_of=64) is None) == (native.library() is None)
    assert _compiled(x.astype(np.float64), multiple_of=64) is None  # NumPy for the rest
    assert _compiled(x[:, :40], multiple_of=40) is None


def rows_alone_equal(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> bool:
    whole = fn(x)
    return all(np.array_equal(fn(x[i : i + 1])[0], whole[i]) for i in range(len(x)))


def test_rms_norm() -> None:
    x = RNG.standard_normal((7, 576)).astype(np.float32) * 3
    w = RNG.standard_normal(576).astype(np.float32)
    got = rms_norm(x, w, 1e-5, np)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    assert rows_alone_equal(lambda a: rms_norm(a, w, 1e-5, np), x)


def test_silu_mul_over_the_whole_range() -> None:
    gate_up = RNG.standard_normal((5, 2 * 1536)).astype(np.float32) * 4
    gate_up[0, :16] = [-200, -100, -88, -87, -50, -1e-3, 0, 1e-3, 1, 20, 50, 87, 88, 89, 100, 200]
    got = silu_mul(gate_up, 1536, np)
    g, u = gate_up[:, :1536].astype(np.float64), gate_up[:, 1536:].astype(np.float64)
    want = g / (1 + np.exp(-g)) * u
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)
    assert rows_alone_equal(lambda a: silu_mul(a, 1536, np), gate_up)


def test_rope_at_each_rows_position() -> None:
    heads, d, context = 3, 64, 100
    qkv = RNG.standard_normal((6, 5 * d)).astype(np.float32)
    angles = RNG.uniform(0, 6, (context, d // 2))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    pos = np.array([0, 5, 99, 5, 17, 1], dtype=np.int64)
    got = rope(qkv, d, heads, d, (cos, sin), pos, np)  # columns d .. 4d
    x = qkv[:, d : 4 * d].reshape(6, heads, d).astype(np.float64)
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    want = np.concatenate(
        [x[..., :32] * c - x[..., 32:] * s, x[..., :32] * s + x[..., 32:] * c], -1
    )
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    whole = rope(qkv, d, heads, d, (cos, sin), pos, np)
    for i in range(6):
        assert np.array_equal(
            rope(qkv[i : i + 1], d, heads, d, (cos, sin), pos[i : i + 1], np)[0], whole[i]
        )


def test_rms_norm_in_float16_squares_in_float32() -> None:
    """Activations past 256 (this model has them) square past float16's range: the norm is
    taken in float32, so the result stays finite and close to the float32 one (float16 runs
    the NumPy path: the C kernels are float32)."""
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (4, 576)).astype(np.float32)
    x[:, 7] = 900.0  # one large activation per row, as real hidden states have
    weight = rng.normal(1, 0.1, 576).astype(np.float32)
    want = rms_norm(x, weight, 1e-5, np)
    got = rms_norm(x.astype(np.float16), weight.astype(np.float16), 1e-5, np)
    assert got.dtype == np.float16 and np.isfinite(got).all()
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)


def test_address_is_the_arrays_first_element() -> None:
    """native.address (the kernels' pointer arguments) names the same byte as ctypes.data,
    for views with an offset, read-only and empty arrays too."""
    a = np.zeros((4, 6), dtype=np.float32)
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    for arr in (a, a[1:], a[2], frozen, np.zeros(0, dtype=np.float32)):
        assert native.address(arr) == arr.ctypes.data


@pytest.mark.parametrize("name", ["float32", "float16", "q8_0"])
def test_keys_into_the_pool_as_numpy_writes_them(name: str) -> None:
    """KVPool.write_layer's C calls write the bytes of its NumPy assignment, the keys from a
    contiguous array (rope's output), the values strided (columns of qkv); rounding ties,
    overflow and tiny values too."""
    dtype, heads, d, tokens = NAMES[name], 3, 64, 9
    qkv = RNG.standard_normal((tokens, 5 * heads * d)).astype(np.float32)
    qkv[0, :8] = [65520.0, 65519.0, 1e5, -1e5, 1e-8, -3e-8, 2049.0, 2051.0]  # float16 edges
    keys = np.ascontiguousarray(qkv[:, : heads * d].reshape(tokens, heads, d))
    values = qkv[:, 2 * heads * d : 3 * heads * d].reshape(tokens, heads, d)  # strided rows
    rows = RNG.permutation(40)[: tokens * heads].astype(np.int64)
    items = row_items(d, dtype)
    wants = []
    for src in (keys, values):
        want = np.zeros((40, items), dtype)
        with np.errstate(over="ignore"):  # 1e5 rounds to float16's inf, as intended
            want[rows] = (quantize(src) if dtype == Q8_0 else src).reshape(-1, items)
        wants.append(want)
    got = (np.zeros((40, items), dtype), np.zeros((40, items), dtype))
    assert put_kv_rows(got, rows, (keys, values)) == (native.library() is not None)
    if native.library() is not None:
        assert [g.tobytes() for g in got] == [w.tobytes() for w in wants]
    untouched = (np.zeros((40, items), dtype), np.zeros((40, items), dtype))
    assert not put_kv_rows(untouched, rows.astype(np.int32), (keys, values))  # NumPy's then
    assert not put_kv_rows(untouched, rows, (keys, values.astype(np.float64)))
    assert not untouched[0].tobytes().strip(b"\0")  # neither written when one does not suit
