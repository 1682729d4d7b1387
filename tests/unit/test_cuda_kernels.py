"""The GPU's quantized kernels (engine/ops/csrc/qmatmul.cu through CuPy) against gguf's own
dequantization followed by a float64 product, held to the CPU kernels' bound
(test_quant_kernels.py): every supported type, every activation row count 1..64, and each
row's bits the same whatever rows come with it.

Where no GPU is found (CI) they run on the CPU stand-in (tests/cuda_emu); the reference
test of the real model on the GPU is `warmfleet doctor --device cuda`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from engine.ops.kernels import matmul_t
from engine.ops.quant.cuda import GpuQuantMatrix, dequant_rows
from engine.ops.quant.formats import decode, reconstruct
from engine.ops.quant.matrix import QuantMatrix, concat
from tests import cuda_emu
from tests.unit.quant_cases import MAX_ROWS, TYPES, K, N, Stored, T, summation_bound, write_and_read

cp: Any = cuda_emu.cupy()  # on a machine without a GPU, its CPU stand-in
pytestmark = pytest.mark.usefixtures("cuda_module")


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Stored:
    return write_and_read(Path(tmp_path_factory.mktemp("quant")) / "types.gguf")


def on_gpu(stored: Stored, qtype: T) -> tuple[GpuQuantMatrix, np.ndarray]:
    matrix, reference = stored[qtype]
    return GpuQuantMatrix.upload(matrix, cp), reference


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantized_rows_equal_ggufs_bit_for_bit(stored: Stored, qtype: T) -> None:
    w, reference = on_gpu(stored, qtype)
    ids = np.array([5, 0, N - 1, 5], dtype=np.int64)
    got = cp.asnumpy(dequant_rows(w, cp.asarray(ids)))
    assert got.dtype == np.float32 and np.array_equal(got, reference[ids])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_product_within_float32_summation_error_for_1_to_64_rows(stored: Stored, qtype: T) -> None:
    w, reference = on_gpu(stored, qtype)
    rng = np.random.default_rng(int(qtype))
    x = rng.standard_normal((MAX_ROWS, K)).astype(np.float32)
    exact = x.astype(np.float64) @ reference.T.astype(np.float64)
    xg = cp.asarray(x)
    alone = np.stack([cp.asnumpy(matmul_t(xg[m : m + 1], w))[0] for m in range(MAX_ROWS)])
    assert alone.shape == (MAX_ROWS, N)
    assert (np.abs(alone - exact) <= summation_bound(x, reference)).all()
    for rows in range(1, MAX_ROWS + 1):
        got = cp.asnumpy(matmul_t(xg[:rows], w))
        # each row has the bits it has alone, whatever rows come with it
        assert np.array_equal(got, alone[:rows]), f"{rows} rows"


def test_a_stacked_matrix_of_mixed_types_multiplies_as_its_parts(stored: Stored) -> None:
    types = (T.Q4_1, T.Q6_K, T.Q8_0)  # 4-bit codes widened to bytes, groups of 16
    joined = concat([stored[t][0] for t in types])
    assert joined is not None and joined.group == 16
    w = GpuQuantMatrix.upload(joined, cp)
    reference = np.concatenate([stored[t][1] for t in types])
    x = np.random.default_rng(2).standard_normal((9, K)).astype(np.float32)
    got = cp.asnumpy(matmul_t(cp.asarray(x), w))
    exact = x.astype(np.float64) @ reference.T.astype(np.float64)
    assert (np.abs(got - exact) <= summation_bound(x, reference)).all()
    rows = cp.asnumpy(dequant_rows(w, cp.arange(3 * N)))
    assert np.array_equal(rows, reference)


def test_no_rows_and_non_contiguous_activations() -> None:
    matrix_rows = 40
    raw = np.random.default_rng(4).standard_normal((matrix_rows, K)).astype(np.float32)
    q = gguf.quants.quantize(raw, T.Q8_0)
    decoded = decode(q, T.Q8_0)
    w = GpuQuantMatrix.upload(QuantMatrix.from_decoded(decoded, "Q8_0"), cp)
    assert matmul_t(cp.zeros((0, K), dtype=cp.float32), w).shape == (0, matrix_rows)
    wide = cp.asarray(np.random.default_rng(5).standard_normal((3, 2 * K)).astype(np.float32))
    x = wide[:, ::2]  # a strided view: copied to contiguous float32 first
    got = cp.asnumpy(matmul_t(x, w))
    exact = cp.asnumpy(x).astype(np.float64) @ reconstruct(decoded).T.astype(np.float64)
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-3)


def test_float32_weights_as_they_are_multiply_as_float32_does() -> None:
    """KIND_F32 (an MoE router's form on the GPU): each row's bits its own, the product
    within float32's summation bound; rows of a length the kernel's units do not divide
    are refused."""
    w = np.random.default_rng(6).standard_normal((24, K)).astype(np.float32)
    m = GpuQuantMatrix.of_float32(w, K, cp)
    x = np.random.default_rng(7).standard_normal((11, K)).astype(np.float32)
    got = cp.asnumpy(matmul_t(cp.asarray(x), m))
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    assert (np.abs(got - exact) <= summation_bound(x, w)).all()
    for r in range(len(x)):
        assert np.array_equal(cp.asnumpy(matmul_t(cp.asarray(x[r : r + 1]), m))[0], got[r])
    with pytest.raises(ValueError, match="32-weight units"):
        GpuQuantMatrix.of_float32(w[:, :48], 48, cp)
