"""A mixture of experts on the GPU (engine/ops/moe_cuda.py, quant/cuda_experts.py): the
grouped kernel gives each pair the bits the plain kernel gives its row with its expert's
matrix, whatever else is in the launch; the FFN is the CPU's within float32 rounding, each
row's bits its own. Where no GPU is found (CI) on the CPU stand-in (tests/cuda_emu)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.ops.moe import buckets, moe_ffn_gpt_oss, moe_ffn_numpy
from engine.ops.moe_cuda import CudaExperts, moe_ffn_cuda
from engine.ops.quant.cuda import GpuQuantMatrix, matmul_t
from engine.ops.quant.cuda_experts import GpuExperts, grouped_matmul_t, tile_plan
from engine.ops.quant.formats import decode
from engine.ops.quant.matrix import QuantMatrix
from tests import cuda_emu
from tests.unit.expert_cases import T, random_experts
from tests.unit.test_moe_cuda_routing import random_layer

cp: Any = cuda_emu.cupy()  # on a machine without a GPU, its CPU stand-in
pytestmark = pytest.mark.usefixtures("cuda_module")
TYPES = (T.Q8_0, T.Q4_K, T.Q6_K, T.MXFP4, T.BF16, T.F32)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_each_pair_has_the_bits_of_its_row_times_its_expert_alone(qtype: T) -> None:
    rng = np.random.default_rng(int(qtype))
    m = random_experts(rng, qtype, e=5, n=40, k=256)
    experts = GpuExperts.upload(m, cp)
    x = rng.standard_normal((19, 256)).astype(np.float32)
    chosen = rng.integers(0, 5, size=(19, 3))
    order, starts = buckets(chosen, 5)
    rows = order // 3
    tiles = cp.asarray(tile_plan(starts, len(order), np))
    got = cp.asnumpy(grouped_matmul_t(cp.asarray(x), experts, cp.asarray(rows), tiles))
    for e in range(5):
        pairs = np.arange(starts[e], starts[e + 1])
        if qtype == T.F32:  # no plain kernel of float32 weights: against NumPy
            want = x[rows[pairs]] @ m.dense(e).T
            np.testing.assert_allclose(got[pairs], want, rtol=0, atol=1e-4)
            continue
        alone = GpuQuantMatrix.upload(
            QuantMatrix.from_decoded(decode(m.data[e], qtype), qtype.name), cp
        )
        for p in pairs:  # one row in the plain kernel: the bits of the pair
            want = cp.asnumpy(matmul_t(cp.asarray(x[rows[p] : rows[p] + 1]), alone))[0]
            assert np.array_equal(got[p], want), (e, p)


@pytest.mark.parametrize("gpt_oss", [False, True], ids=["qwen3moe", "gpt-oss"])
def test_the_ffn_is_the_cpus_and_each_rows_bits_its_own(gpt_oss: bool) -> None:
    moe = random_layer(gpt_oss, seed=7)
    x = np.random.default_rng(8).standard_normal((13, 64)).astype(np.float32)
    want = moe_ffn_gpt_oss(x, moe, moe.gpt_oss) if moe.gpt_oss else moe_ffn_numpy(x, moe)
    experts = CudaExperts.upload(moe, cp)
    together = cp.asnumpy(moe_ffn_cuda(cp.asarray(x), experts, cp))
    np.testing.assert_allclose(together, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
    for r in range(len(x)):
        alone = cp.asnumpy(moe_ffn_cuda(cp.asarray(x[r : r + 1]), experts, cp))
        assert np.array_equal(alone[0], together[r]), r
