"""The quantized kernels against gguf's own dequantization followed by a float32 product.

Every supported type is written into a tiny GGUF file (quant_cases.py). Both implementations
(the C kernels and the Numba fallback) are held to the same bound, for every activation row
count 1..64.

The bound: the dequantized weights are exact (formats.py), so the only error is the float32
summation of K products, |y - y64| <= gamma_K * sum_k |x_k w_k| with gamma_K = K u / (1 - K u)
and u = 2^-24 (recursive summation; the kernels' blocked sums stay well inside it).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.ops import kernels as kernels_module
from engine.ops.kernels import matmul_t, plan_rows
from engine.ops.quant import Kernels, fallback, native
from engine.ops.quant.formats import decode, reconstruct
from engine.ops.quant.matrix import concat
from tests.unit.quant_cases import (
    K_QUANTS,
    MAX_ROWS,
    TYPES,
    K,
    N,
    Stored,
    T,
    U,
    random_blocks,
    summation_bound,
    write_and_read,
)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Stored:
    return write_and_read(Path(tmp_path_factory.mktemp("quant")) / "types.gguf")


def implementations() -> list[Kernels]:
    """The C kernels (where a compiler is found) and the Numba fallback."""
    compiled = native.load()
    numba: Kernels = fallback.NumbaKernels()
    return [compiled, numba] if compiled is not None else [numba]


IMPLS = implementations()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_decoded_weights_equal_ggufs_dequantization_bit_for_bit(stored: Stored, qtype: T) -> None:
    matrix, reference = stored[qtype]
    assert matrix.shape == (N, K) and reference.shape == (N, K)
    out = np.empty((N, K), dtype=np.float32)
    for impl in IMPLS:
        impl.dequant(matrix, np.arange(N, dtype=np.int64), out, 2)
        assert np.array_equal(out, reference), impl


@pytest.mark.parametrize("impl", IMPLS, ids=lambda i: i.name)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_product_within_float32_summation_error_for_1_to_64_rows(
    stored: Stored, qtype: T, impl: Kernels
) -> None:
    matrix, w = stored[qtype]
    rng = np.random.default_rng(int(qtype))
    x = rng.standard_normal((MAX_ROWS, K)).astype(np.float32)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    bound = summation_bound(x, w)
    alone = np.empty((MAX_ROWS, N), dtype=np.float32)
    for m in range(MAX_ROWS):
        impl.matmul(matrix, x[m : m + 1], alone[m : m + 1], 2)
    assert (np.abs(alone - exact) <= bound).all()
    for rows in range(1, MAX_ROWS + 1):
        out = np.full((rows, N), np.nan, dtype=np.float32)
        impl.matmul(matrix, x[:rows], out, 2)
        # each row has the bits it has alone, whatever rows come with it
        assert np.array_equal(out, alone[:rows]), f"{rows} rows"


def test_the_files_own_scales_stay_float16_and_products_of_scales_float32(
    stored: Stored,
) -> None:
    # Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: a block's scale (and min) is a float16 in the file,
    # kept as it is (Q5_0's offset -16d is exact in float16 too);
    # a K-quant's is a float16 times a 6- or 8-bit sub-scale, not a float16 in general
    for qtype in TYPES:
        matrix, _ = stored[qtype]
        half = qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
        assert matrix.half == half, qtype.name
        assert matrix.scale.dtype == matrix.offset.dtype == (np.float16 if half else np.float32)
    q8 = stored[T.Q8_0][0]
    assert q8.nbytes == N * K + 2 * 2 * N * K // 32  # the codes and two float16 per block


def test_the_two_implementations_agree_within_the_bound(
    stored: Stored,
) -> None:
    if len(IMPLS) < 2:
        pytest.skip("no C compiler here: only the Numba kernels run")
    x = np.random.default_rng(1).standard_normal((5, K)).astype(np.float32)
    for qtype in TYPES:
        matrix, w = stored[qtype]
        a, b = (np.empty((5, N), dtype=np.float32) for _ in range(2))
        IMPLS[0].matmul(matrix, x, a, 2)
        IMPLS[1].matmul(matrix, x, b, 2)
        bound = 2 * K * U * (np.abs(x) @ np.abs(w.T))
        assert (np.abs(a - b) <= bound).all(), qtype.name


def test_concat_widens_codes_and_splits_groups_without_changing_a_weight(
    stored: Stored,
) -> None:
    parts = [stored[t][0] for t in (T.Q4_1, T.Q6_K, T.Q8_0)]  # 4-bit / 16-groups / 8-bit
    joined = concat(parts)
    assert joined is not None and joined.shape == (3 * N, K) and joined.group == 16
    out = np.empty(joined.shape, dtype=np.float32)
    IMPLS[0].dequant(joined, np.arange(3 * N, dtype=np.int64), out, 2)
    assert np.array_equal(out, np.concatenate([stored[t][1] for t in (T.Q4_1, T.Q6_K, T.Q8_0)]))
    assert joined.source == "Q4_1+Q6_K+Q8_0"
    assert concat([stored[T.F16][0], stored[T.Q4_0][0]]) is None  # no common form


def test_reconstruct_matches_for_every_type(
    stored: Stored,
) -> None:
    rng = np.random.default_rng(3)
    for qtype in TYPES:
        raw = (
            random_blocks(rng, qtype, 4, 256)
            if qtype in K_QUANTS
            else gguf.quants.quantize(rng.standard_normal((4, 256)).astype(np.float32), qtype)
        )
        assert np.array_equal(reconstruct(decode(raw, qtype)), gguf.quants.dequantize(raw, qtype))


@pytest.mark.parametrize("impl", IMPLS, ids=lambda i: i.name)
@pytest.mark.parametrize("scratch_bytes", [32 << 20, 4 * K * 8])  # one slab; slabs of 8 rows
def test_matmul_t_runs_kernel_rows_and_long_chunks_on_quantized_weights(
    stored: Stored,
    impl: Kernels,
    scratch_bytes: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the C kernels take every row on AVX-512 and chunks of up to 128 on AVX2; the Numba
    # fallback sends long chunks to BLAS on weights expanded into the scratch buffer (in
    # slabs when it is small)
    monkeypatch.setattr(kernels_module, "SCRATCH_BYTES", scratch_bytes)
    monkeypatch.setattr(kernels_module, "quant_kernels", lambda: impl)
    matrix, w = stored[T.Q4_1]
    lengths = [1, 40, 3, 33, 1]  # decode rows, two long chunks, a short chunk
    runs = plan_rows(lengths)
    assert [kernel for _, _, kernel in runs] == [True, False, True, False, True]
    x = np.random.default_rng(9).standard_normal((sum(lengths), K)).astype(np.float32)
    got = matmul_t(x, matrix, runs)
    np.testing.assert_allclose(got, x.astype(np.float64) @ w.T.astype(np.float64), atol=1e-3)
    # a chunk's rows are what it gives alone, whatever else the step holds
    alone = matmul_t(x[1:41], matrix, plan_rows([40]))
    assert np.array_equal(got[1:41], alone)
    if impl.chunk_rows is None or impl.chunk_rows >= 40:  # every row a decode row's bits
        one = np.empty((1, N), dtype=np.float32)
        impl.matmul(matrix, x[20:21], one, 2)
        assert np.array_equal(got[20:21], one)


def test_the_c_kernels_build_wherever_a_compiler_is_found() -> None:
    """Every other test here holds for the Numba fallback too: without this one, a C
    kernel that stopped compiling would pass unnoticed on the slower path."""
    if os.environ.get("WARMFLEET_KERNELS", "").lower() == "numba":
        pytest.skip("WARMFLEET_KERNELS=numba asks for the fallback")
    if shutil.which(os.environ.get("CC") or "cc") is None:
        pytest.skip("no C compiler on this machine: the Numba kernels serve")
    assert native.load() is not None
    assert isinstance(IMPLS[0], native.NativeKernels)
