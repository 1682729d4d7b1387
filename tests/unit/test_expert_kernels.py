"""The grouped products on expert weights read in place from their GGUF blocks
(engine/ops/csrc/experts.c): each output the same bits whatever bucket the pair sits in and
however many threads run, in both kinds of products; the float32 products (F32, F16, BF16,
and the quantized types under WARMFLEET_EXPERT_PRODUCTS=float) read every weight exactly as
gguf-py dequantizes it and stay within float32's summation bound; the integer products of
the quantized types are exactly their integer sums on the activations' 8-bit blocks and stay
within the bound of that rounding; experts with no pairs are never read."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from engine.ops.quant import experts_native
from engine.ops.quant.experts import ExpertMatrix
from engine.ops.quant.experts_native import ExpertKernels, Products, load
from tests.unit.expert_cases import (
    BUCKETS,
    INT_TYPES,
    TYPES,
    E,
    K,
    Product,
    act_block,
    bits,
    grouped,
    quantize_rows,
    random_experts,
    starts_of,
)
from tests.unit.quant_cases import T

KERNELS = load()
pytestmark = pytest.mark.skipif(KERNELS is None, reason="no C compiler here")


@pytest.fixture(scope="module")
def kernels() -> ExpertKernels:
    assert KERNELS is not None
    return KERNELS


@pytest.fixture(scope="module")
def experts() -> dict[T, ExpertMatrix]:
    rng = np.random.default_rng(11)
    return {qtype: random_experts(rng, qtype) for qtype in TYPES}


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_one_hot_rows_give_ggufs_weights_bit_for_bit_in_float32_products(
    kernels: ExpertKernels, experts: dict[T, ExpertMatrix], qtype: T
) -> None:
    w = experts[qtype]
    x = np.eye(K, dtype=np.float32)
    rows = np.tile(np.arange(K, dtype=np.int64), E)  # each expert: every one-hot row
    out = grouped(kernels, w, x, [K] * E, rows, products=Products.FLOAT)
    for e in range(E):
        got = out[e * K : (e + 1) * K].T  # [N, K]
        assert np.array_equal(bits(got), bits(w.dense(e))), f"expert {e}"


@pytest.mark.parametrize("products", Products, ids=lambda p: p.name.lower())
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_each_pair_gives_the_same_bits_in_any_bucket_and_thread_count(
    kernels: ExpertKernels, experts: dict[T, ExpertMatrix], qtype: T, products: Products
) -> None:
    w = experts[qtype]
    rng = np.random.default_rng(int(qtype))
    x = rng.standard_normal((40, K)).astype(np.float32)
    # [70, 8, 7, ..]: over one pass of IPAIRS (64) pairs, and either side of CHUNK_PAIRS
    # (experts_int.c: AVX-512's K-quants from the file's blocks below it, a chunk from it)
    for counts in (list(BUCKETS), list(BUCKETS[::-1]), [33, 0, 5, 1, 17, 2], [70, 8, 7, 0, 1, 2]):
        starts = starts_of(counts)
        rows = rng.integers(0, len(x), starts[-1]).astype(np.int64)
        two = grouped(kernels, w, x, counts, rows, 2, products)
        one = grouped(kernels, w, x, counts, rows, 1, products)
        assert not np.isnan(two).any()
        assert np.array_equal(two.view(np.uint32), one.view(np.uint32)), "1 vs 2 threads"
        for e in range(E):
            for p in range(starts[e], starts[e + 1]):
                alone = [1 if i == e else 0 for i in range(E)]
                lone = grouped(kernels, w, x, alone, rows[p : p + 1], 2, products)
                assert np.array_equal(lone[0].view(np.uint32), two[p].view(np.uint32)), (
                    f"{counts}: pair {p} of expert {e}"
                )


def within_bound(
    kernels: ExpertKernels, w: ExpertMatrix, x: np.ndarray, products: Products
) -> np.ndarray:
    """Every output of x's rows through every expert within Product.bound of float64; the
    errors relative to each expert's largest output."""
    counts = [len(x)] * E
    out = grouped(kernels, w, x, counts, np.tile(np.arange(len(x), dtype=np.int64), E), 2, products)
    relative = []
    for e in range(E):
        product = Product.of(w, e, products)
        for r in range(len(x)):
            want, bound = product.bound(x[r].astype(np.float64))
            err = np.abs(out[e * len(x) + r] - want)
            assert np.all(err <= bound), f"expert {e}, row {r}: {(err / bound).max():.3f}"
            relative.append(err / np.abs(want).max())
    return np.concatenate(relative)


@pytest.mark.parametrize("products", Products, ids=lambda p: p.name.lower())
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_products_are_within_their_bound_of_float64(
    kernels: ExpertKernels, experts: dict[T, ExpertMatrix], qtype: T, products: Products
) -> None:
    """Float32 products: float32's summation bound. Integer ones: the activations' rounding
    to 8 bits plus the float steps' (expert_cases.Product.bound); on these random weights
    their typical error is a few tenths of a percent of the largest output."""
    x = np.random.default_rng(100 + int(qtype)).standard_normal((9, K)).astype(np.float32)
    x[3] *= 1e-30  # tiny rows: the 8-bit scale still in float32's normal range
    relative = within_bound(kernels, experts[qtype], x, products)
    if products == Products.INTEGER and qtype in INT_TYPES:
        assert np.median(relative) < 1e-2


@pytest.mark.parametrize("qtype", INT_TYPES, ids=lambda t: t.name)
def test_integer_products_are_the_integer_sums_of_the_8_bit_activations(
    kernels: ExpertKernels, experts: dict[T, ExpertMatrix], qtype: T
) -> None:
    """Activations that are already 8-bit values (x = d q for the kernel's own d and q):
    the integer products then round only in their float steps, far inside the bound, and
    a row of zeros gives zeros, a row with a NaN NaNs."""
    w, rng = experts[qtype], np.random.default_rng(7)
    block = act_block(qtype)
    q = rng.integers(-127, 128, (4, K)).astype(np.float32)
    q[:, ::block] = 127  # each block's amax 127: d = scale / 127 * 127, q as chosen
    x = (q * np.float32(2.0**-7)).astype(np.float32)
    got_q, _ = quantize_rows(x, block)
    assert np.array_equal(got_q, q.astype(np.int8))
    x = np.concatenate([x, np.zeros((1, K), np.float32), np.full((1, K), np.nan, np.float32)])
    out = grouped(kernels, w, x, [len(x)] + [0] * (E - 1), np.arange(len(x), dtype=np.int64))
    want = x[:4].astype(np.float64) @ w.dense(0).T.astype(np.float64)
    assert np.allclose(out[:4], want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    assert np.array_equal(out[4], np.zeros(w.n, np.float32))
    assert np.isnan(out[5]).all()


def test_the_products_switch_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read = experts_native.expert_products
    try:
        for value, want in (("", Products.INTEGER), ("float", Products.FLOAT), ("Integer", 0)):
            monkeypatch.setenv(experts_native.PRODUCTS_ENV, value)
            read.cache_clear()
            assert read() == want
        monkeypatch.setenv(experts_native.PRODUCTS_ENV, "fp8")
        read.cache_clear()
        with pytest.raises(ValueError, match="integer or float"):
            read()
    finally:
        monkeypatch.delenv(experts_native.PRODUCTS_ENV)
        read.cache_clear()


def test_wide_rows_and_strided_operands(kernels: ExpertKernels) -> None:
    """Rows of activations and outputs inside wider arrays (a layer's scratch): the same
    bits as contiguous ones; k = 2048 passes several chunks, each pair's sum the same bits as
    alone."""
    rng = np.random.default_rng(5)
    w = random_experts(rng, T.Q4_K, e=3, n=9, k=2048)
    x_wide = rng.standard_normal((7, 2048 + 64)).astype(np.float32)
    counts, rows = [4, 0, 3], np.array([0, 2, 4, 6, 1, 3, 5], np.int64)
    want = grouped(kernels, w, np.ascontiguousarray(x_wide[:, :2048]), counts, rows)
    out_wide = np.full((7, 9 + 7), np.nan, np.float32)
    kernels.matmul(w, x_wide[:, :2048], rows, starts_of(counts), out_wide[:, :9], 2)
    assert np.array_equal(out_wide[:, :9].view(np.uint32), want.view(np.uint32))
    assert np.isnan(out_wide[:, 9:]).all()
    for p, e in enumerate([0, 0, 0, 0, 2, 2, 2]):  # several chunks against a lone row's registers
        alone = grouped(
            kernels, w, x_wide[:, :2048].copy(), [int(i == e) for i in range(3)], rows[p : p + 1]
        )
        assert np.array_equal(alone[0].view(np.uint32), want[p].view(np.uint32)), f"pair {p}"


def test_arguments_it_does_not_take_are_refused(kernels: ExpertKernels) -> None:
    rng = np.random.default_rng(1)
    w = random_experts(rng, T.Q8_0, e=2, n=4, k=64)
    x, out = np.ones((2, 64), np.float32), np.empty((2, 4), np.float32)
    rows = np.array([0, 1], np.int64)
    with pytest.raises(ValueError):  # buckets that do not sum to the pairs
        kernels.matmul(w, x, rows, starts_of([1, 0]), out, 1)
    with pytest.raises(ValueError):  # a row past x
        kernels.matmul(w, x, np.array([0, 2], np.int64), starts_of([1, 1]), out, 1)
    q2 = ExpertMatrix(T.Q2_K, np.zeros((2, 4, 84), np.uint8), 256)  # a type it does not read
    with pytest.raises(ValueError, match="does not read"):
        kernels.matmul(q2, np.ones((2, 256), np.float32), rows, starts_of([1, 1]), out, 1)


UNREAD = textwrap.dedent(
    """
    import ctypes, mmap, numpy as np
    from engine.ops.quant.experts import ExpertMatrix
    from engine.ops.quant.experts_native import expert_matmul
    from tests.unit.expert_cases import random_experts, starts_of
    from tests.unit.quant_cases import T

    w = random_experts(np.random.default_rng(3), T.Q8_0, e=3, n=256, k=512)
    page, size = mmap.PAGESIZE, w.nbytes
    area = mmap.mmap(-1, (size + page - 1) // page * page + page)
    data = np.frombuffer(area, np.uint8, size).reshape(w.data.shape)
    data[:] = w.data
    guarded = ExpertMatrix(w.qtype, data, w.k)
    lo = (w.expert_bytes + page - 1) // page * page  # the whole pages inside expert 1
    hi = 2 * w.expert_bytes // page * page
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(data.ctypes.data + lo, hi - lo, 0) == 0  # PROT_NONE
    x = np.random.default_rng(4).standard_normal((5, 512)).astype(np.float32)
    rows, starts = np.array([0, 1, 2, 3, 4], np.int64), starts_of([2, 0, 3])
    got, want = (np.empty((5, 256), np.float32) for _ in range(2))
    expert_matmul(guarded, x, rows, starts, got, 2)
    expert_matmul(w, x, rows, starts, want, 2)
    print("same" if np.array_equal(got, want) else "differ")
    """
)


def test_experts_without_pairs_are_never_read() -> None:
    """Expert 1's pages unreadable (a read would kill the process): the call still runs."""
    done = subprocess.run(
        [sys.executable, "-c", UNREAD], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "same"
