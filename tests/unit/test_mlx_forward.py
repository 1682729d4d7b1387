"""The MLX backend's forward pass (engine/mlx_backend) on MLX's CPU build against the NumPy
one, and its paged pool's growth, copy on write and round trip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import mlx.core as mx
import numpy as np
import pytest

from common.errors import InvalidRequestError
from engine.device import array_module
from engine.kv.kv_pool import PagedKV
from engine.mlx_backend.kv_pool import FIRST_BLOCKS, MLXKVPool
from engine.model import Model
from engine.ops.kernels import SMALL_ROWS
from engine.text.model_config import ModelConfig
from tests.paged import new_kv, pool_of, run_segments, run_step
from tests.tiny_gguf import (
    VOCAB_SIZE,
    write_tiny_llama,
)

T = gguf.GGMLQuantizationType


# 3. the forward pass against the NumPy one

FORWARD_VARIANTS: dict[str, dict[str, Any]] = {
    "f32-untied": {},
    "q4_1-tied": {"matrix_type": T.Q4_1, "tie_embeddings": True},
}
LOGITS_ATOL = 1e-4  # the logits reach ~60 (Q4_1, tied); they are ~1e-5 apart in practice
KV_ATOL = 1e-5  # keys and values are O(1), ~1e-6 apart in practice


@pytest.fixture(scope="module", params=list(FORWARD_VARIANTS))
def model_pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Model, Model]:
    """The same file on MLX (quantized where MLX can) and on NumPy (float32 weights)."""
    folder = tmp_path_factory.mktemp("fwd")
    path = write_tiny_llama(folder / "m.gguf", **FORWARD_VARIANTS[request.param])
    cpu = Model.load(path, device="cpu", weights="float32", kv_dtype="float32")
    return Model.load(path, device="mlx", kv_dtype="float32"), cpu


def mixed_steps(model: Model) -> tuple[list[np.ndarray], list[PagedKV]]:
    """Prefills, then one step of decode rows, short chunks (one crossing a block) and two
    chunks longer than SMALL_ROWS, in an order the attention calls do not keep; the logits
    of every step and the tables."""
    rng = np.random.default_rng(5)
    prompt = [[int(t) for t in rng.integers(3, VOCAB_SIZE, size=n)] for n in (21, 9, 13)]
    a, b, d = (new_kv(model) for _ in range(3))
    first = run_segments(model, [(a, prompt[0][:20]), (b, prompt[1][:8]), (d, prompt[2])])
    c, e, f = (new_kv(model) for _ in range(3))
    long_c = [int(t) for t in rng.integers(3, VOCAB_SIZE, size=SMALL_ROWS + 8)]
    long_f = [int(t) for t in rng.integers(3, VOCAB_SIZE, size=SMALL_ROWS + 3)]
    chunk_d = [int(t) for t in rng.integers(3, VOCAB_SIZE, size=6)]  # positions 13..18
    new_e = [int(t) for t in rng.integers(3, VOCAB_SIZE, size=3)]
    second = run_step(model, [(a, prompt[0][20:], True), (c, long_c, True),
                              (b, prompt[1][8:], True), (d, chunk_d, True),
                              (e, new_e, False), (f, long_f, True)])  # fmt: skip
    assert second.shape == (5, VOCAB_SIZE) and second.dtype == np.float32  # e wants none
    third = run_step(model, [(e, [7], True), (c, [8], True)])  # decode after a long chunk
    return [first, second, third], [a, b, c, d, e, f]


def test_a_mixed_step_gives_numpys_logits_and_kv(model_pair: tuple[Model, Model]) -> None:
    on_mlx, on_numpy = model_pair
    assert isinstance(pool_of(on_mlx), MLXKVPool)
    assert not isinstance(pool_of(on_numpy), MLXKVPool)
    got, tables = mixed_steps(on_mlx)
    expected, expected_tables = mixed_steps(on_numpy)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=0, atol=LOGITS_ATOL)
        assert np.array_equal(g.argmax(-1), e.argmax(-1))
    for kv, ref in zip(tables, expected_tables, strict=True):
        k, v, ids = kv.state()
        k_ref, v_ref, ids_ref = ref.state()
        assert ids == ids_ref and k.shape == k_ref.shape and k.shape[2] == len(ids)
        np.testing.assert_allclose(k, k_ref, rtol=0, atol=KV_ATOL)
        np.testing.assert_allclose(v, v_ref, rtol=0, atol=KV_ATOL)
    for kv in (*tables, *expected_tables):
        kv.release()


NO_LOGITS_STEP = """
import sys
from pathlib import Path

import gguf

from engine.step import Segment
from engine.model import Model
from tests.paged import new_kv, pool_of
from tests.tiny_gguf import write_tiny_llama

path = write_tiny_llama(Path(sys.argv[1]), matrix_type=gguf.GGMLQuantizationType.Q4_1)
model = Model.load(path, device="mlx")
kv = new_kv(model)
kv.prepare_write(0, 40)
segment = Segment(kv, 0, 40, want_logits=False)
print(model.run(pool_of(model), list(range(3, 43)), list(range(40)), [segment]).shape)
"""


def test_a_step_wanting_no_logits_runs_with_a_quantized_output(tmp_path: Path) -> None:
    """The runner makes such steps: a prompt longer than prefill_chunk_tokens, alone, is
    prefilled in chunks whose logits nobody wants. In a child process: MLX's CPU build
    dies (SIGFPE) on a quantized product of zero rows, which the forward pass must avoid."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    argv = [sys.executable, "-c", NO_LOGITS_STEP, str(tmp_path / "q4_1.gguf")]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=repo, env=env, timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip() == f"(0, {VOCAB_SIZE})"


# 4. the pool

POOL_CONFIG = ModelConfig(architecture="llama", num_layers=2, dim=32, ffn_dim=64, num_heads=4,
                          num_kv_heads=2, head_dim=8, rms_eps=1e-5, rope_base=1e4,
                          context_length=4096, vocab_size=VOCAB_SIZE)  # fmt: skip


def random_kv(rng: np.random.Generator, n: int, dtype: type = np.float32) -> np.ndarray:
    """Keys or values [layers, kv_heads, n, head_dim]."""
    c = POOL_CONFIG
    return rng.standard_normal((c.num_layers, c.num_kv_heads, n, c.head_dim)).astype(dtype)


def new_pool(num_blocks: int, dtype: type = np.float32) -> MLXKVPool:
    return MLXKVPool(POOL_CONFIG, num_blocks, np.dtype(dtype), mx, "fingerprint")


def assert_state(kv: PagedKV, k: np.ndarray, v: np.ndarray, ids: list[int]) -> None:
    got_k, got_v, got_ids = kv.state()
    assert got_ids == ids and got_k.dtype == k.dtype
    assert np.array_equal(got_k, k) and np.array_equal(got_v, v)


def test_growth_keeps_the_blocks_written_before() -> None:
    rng = np.random.default_rng(0)
    pool = new_pool(100)
    assert pool.allocated_blocks == FIRST_BLOCKS
    c = POOL_CONFIG
    assert pool.k_layers[0][0].shape == (FIRST_BLOCKS * pool.block_size, c.num_kv_heads, c.head_dim)
    k1, v1 = random_kv(rng, 40), random_kv(rng, 40)
    first = pool.load("", k1, v1, list(range(40)))  # blocks 0..2
    n2 = (FIRST_BLOCKS + 6) * pool.block_size
    k2, v2 = random_kv(rng, n2), random_kv(rng, n2)
    second = pool.load("", k2, v2, list(range(1000, 1000 + n2)))  # up to block 72
    assert max(second.blocks) >= FIRST_BLOCKS
    assert pool.allocated_blocks == 100  # doubling, capped by the pool's size
    assert all(a.shape[0] == 100 * pool.block_size for a in pool.arrays())
    assert_state(first, k1, v1, list(range(40)))
    assert_state(second, k2, v2, list(range(1000, 1000 + n2)))

    # a jump past twice the size: grown to the block asked for
    big = new_pool(300)
    kept = big.load("", k1, v1, list(range(40)))
    big.copy_block(200, kept.blocks[1])
    assert big.allocated_blocks == 201
    copied = big.take(np.full(16, 200), np.arange(16))
    assert np.array_equal(copied[0], k1[:, :, 16:32]) and np.array_equal(copied[1], v1[:, :, 16:32])
    assert_state(kept, k1, v1, list(range(40)))


def test_a_write_into_a_forked_block_is_copied_first() -> None:
    rng = np.random.default_rng(1)
    pool = new_pool(16)
    k, v, ids = random_kv(rng, 20), random_kv(rng, 20), list(range(50, 70))
    original = pool.load("", k, v, ids)  # block 0 full, block 1 holds 4
    fork = original.fork()
    assert fork.blocks == original.blocks
    fork.trim(18)
    fork.prepare_write(18, 3)  # into shared block 1: copied (copy_block) first
    assert fork.blocks[0] == original.blocks[0] and fork.blocks[1] != original.blocks[1]
    k_new, v_new = random_kv(rng, 3), random_kv(rng, 3)
    pool.put(*fork.slots(18, 3), k_new, v_new)
    fork.commit([1, 2, 3])
    assert_state(original, k, v, ids)
    fork_k = np.concatenate([k[:, :, :18], k_new], axis=2)
    fork_v = np.concatenate([v[:, :, :18], v_new], axis=2)
    assert_state(fork, fork_k, fork_v, [*ids[:18], 1, 2, 3])
    for kv in (original, fork):
        kv.release()
    pool.alloc.check()


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: d.__name__)
def test_load_then_state_round_trips_exactly(dtype: type) -> None:
    rng = np.random.default_rng(2)
    pool = new_pool(8, dtype)
    k, v, ids = random_kv(rng, 37, dtype), random_kv(rng, 37, dtype), list(range(37))
    kv = pool.load("tenant", k, v, ids)
    assert kv.offset == 37 and kv.token_ids == ids
    assert_state(kv, k, v, ids)
    # the same tokens again: the two full blocks are shared, the rest written anew
    again = pool.load("tenant", k, v, ids)
    assert again.blocks[:2] == kv.blocks[:2] and again.blocks[2] != kv.blocks[2]
    assert_state(again, k, v, ids)
    empty = pool.load("tenant", k[:, :, :0], v[:, :, :0], [])
    assert_state(empty, k[:, :, :0], v[:, :, :0], [])


# 5. the device


def test_mlx_is_a_device_and_a_bad_name_is_refused(tmp_path: Path) -> None:
    assert array_module("mlx") is mx
    model = Model.load(write_tiny_llama(tmp_path / "m.gguf"), device="mlx")
    assert model.device == "mlx" and model.xp is mx
    pool = model.new_pool(1 << 20)
    assert isinstance(pool, MLXKVPool)
    assert pool.num_blocks == (1 << 20) // pool.block_bytes
    with pytest.raises(InvalidRequestError, match="device"):
        array_module("metal")
    with pytest.raises(InvalidRequestError, match="device"):
        Model.load(tmp_path / "m.gguf", device="gpu")
