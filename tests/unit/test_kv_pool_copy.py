"""KVPool.put and take: whole blocks go as block copies, the rest position by position;
both must equal indexing every position."""

from __future__ import annotations

import numpy as np
import pytest

from engine.kv.kv_pool import KVPool
from engine.text.model_config import ModelConfig

CONFIG = ModelConfig(architecture="llama", num_layers=3, dim=32, ffn_dim=64, num_heads=4,
                     num_kv_heads=2, head_dim=8, rms_eps=1e-5, rope_base=1e4,
                     context_length=256, vocab_size=50)  # fmt: skip
SIZE = 16


def positions(case: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(blocks, slots): whole blocks then a partial one (a restore), a start inside a
    block, a whole block out of slot order, and scattered single positions."""
    ids = rng.permutation(40)
    if case == "whole then tail":
        n = 5 * SIZE + 7
        return ids[np.arange(n) // SIZE], np.arange(n) % SIZE
    if case == "starts mid-block":
        pos = np.arange(9, 9 + 3 * SIZE)
        return ids[pos // SIZE], pos % SIZE
    if case == "slots out of order":
        return np.full(SIZE, ids[0]), rng.permutation(SIZE)
    return ids[:10], rng.integers(0, SIZE, 10)


@pytest.mark.parametrize("case", ["whole then tail", "starts mid-block", "slots out of order",
                                  "scattered"])  # fmt: skip
def test_put_and_take_equal_indexing_every_position(case: str) -> None:
    rng = np.random.default_rng(len(case))
    pool = KVPool(CONFIG, 40, np.dtype(np.float32), np)
    pool.k[...] = rng.standard_normal(pool.k.shape)
    pool.v[...] = rng.standard_normal(pool.v.shape)
    blocks, slots = positions(case, rng)
    n, d = len(slots), CONFIG.head_dim
    want_k = pool.k[:, blocks, :, slots].transpose(1, 2, 0, 3)
    want_v = pool.v[:, blocks, :, slots].transpose(1, 2, 0, 3)
    got_k, got_v = pool.take(blocks, slots)
    assert got_k.shape == (CONFIG.num_layers, CONFIG.num_kv_heads, n, d)
    assert np.array_equal(got_k, want_k) and np.array_equal(got_v, want_v)
    new_k = rng.standard_normal(got_k.shape).astype(np.float32)
    new_v = rng.standard_normal(got_v.shape).astype(np.float32)
    before_k, before_v = pool.k.copy(), pool.v.copy()
    pool.put(blocks, slots, new_k, new_v)
    before_k[:, blocks, :, slots] = new_k.transpose(2, 0, 1, 3)
    before_v[:, blocks, :, slots] = new_v.transpose(2, 0, 1, 3)
    assert np.array_equal(pool.k, before_k) and np.array_equal(pool.v, before_v)
