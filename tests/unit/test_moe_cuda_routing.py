"""What the CUDA path of a mixture of experts (engine/ops/moe_cuda.py) prepares for its
grouped kernel, on NumPy: the tiles cutting each expert's run of pairs into launches' rows
that cover every pair once, and MXFP4 in the GPU's 4-bit form. The kernel and the FFN
around it run in tests/unit/test_cuda_experts.py (on the CPU stand-in where no GPU is
found)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.ops.quant.cuda import TILE_ROWS
from engine.ops.quant.cuda_experts import fp4_form, tile_plan
from engine.ops.quant.experts import GptOssExperts, MoEWeights
from engine.ops.quant.formats import MXFP4_VALUES
from tests.unit.expert_cases import T, random_experts, starts_of


@pytest.mark.parametrize("counts", [(0,), (1,), (8, 0, 9, 17), (0, 0, 3), (16, 1, 0, 40, 7)])
def test_the_tiles_cover_every_pair_once_each_within_one_expert(counts: tuple[int, ...]) -> None:
    starts = starts_of(counts)
    pairs = int(starts[-1])
    tiles = tile_plan(starts, pairs, np)
    assert tiles.dtype == np.int32
    experts, first, rows = tiles[:, tiles[2] > 0]  # the tiles past the routing's hold none
    assert (rows <= TILE_ROWS).all() and (tiles[2] >= 0).all()
    covered = np.concatenate([np.zeros(0, int), *map(np.arange, first, first + rows)])
    assert covered.tolist() == list(range(pairs))  # in order, each once
    for e, f, r in zip(experts, first, rows, strict=True):
        assert starts[e] <= f and f + r <= starts[e + 1]
    assert len(experts) == sum(-(-c // TILE_ROWS) for c in counts)
    assert tiles.shape[1] == -(-pairs // TILE_ROWS) + min(len(counts), pairs)  # by shape


def random_layer(gpt_oss: bool, seed: int) -> MoEWeights:
    rng = np.random.default_rng(seed)
    e, dim, ffn, top_k = 8, 64, 96, 3
    gate, up = (random_experts(rng, T.Q8_0, e, ffn, dim) for _ in "gu")
    down = random_experts(rng, T.BF16, e, dim, ffn)
    router = rng.standard_normal((e, dim)).astype(np.float32)
    extra = None
    if gpt_oss:
        sizes = ((e,), (e, ffn), (e, ffn), (e, dim))
        extra = GptOssExperts(*(rng.standard_normal(s).astype(np.float32) for s in sizes))
    return MoEWeights(router, gate, up, down, top_k, gpt_oss=extra)


def test_mxfp4_on_the_gpu_keeps_the_files_nibbles_and_gives_its_exact_values() -> None:
    """KIND_FP4's form (cuda_experts.fp4_form), decoded as qmatmul.cu decodes it (byte j of a
    block: value j in its low nibble, j + 16 in its high one, through MXFP4_VALUES, times
    the block's scale), is gguf's dequantization exactly, in 0.625 bytes a weight."""
    m = random_experts(np.random.default_rng(5), T.MXFP4, e=3, n=10, k=128)
    rows = m.data.reshape(30, -1)
    codes, scale = fp4_form(rows)
    assert codes.shape == (30, 64) and scale.shape == (30, 4) and scale.dtype == np.float32
    blocks = codes.reshape(30, 4, 16)
    nibbles = np.stack([blocks & 0x0F, blocks >> 4], axis=2)  # [30, 4, 2, 16]
    values = MXFP4_VALUES[nibbles.reshape(30, 4, 32)] * scale[..., None]
    want = np.concatenate([m.dense(e) for e in range(3)])
    assert np.array_equal(values.reshape(30, 128).astype(np.float32), want)
    assert (codes.nbytes + scale.nbytes) / (30 * 128) == 0.625
