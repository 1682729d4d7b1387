"""The MLX pool in float16 and q8_0 (--kv-dtype) on MLX's CPU build: the bytes it holds are
those the CPU path writes for the same values (so spill files pass between them), a
session's blocks go in and out unchanged, and a model's steps give the CPU path's logits
and tokens in the same KV dtype."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import mlx.core as mx
import numpy as np
import pytest

from engine.kv_files.kv_dtypes import Q8_0, kv_dtype_named, kv_name, quantize, widened
from engine.mlx_backend.kv_pool import MLXKVPool
from engine.model import Model, kv_dtype_for
from engine.text.model_config import ModelConfig
from tests.paged import new_kv, run_segments
from tests.tiny_gguf import VOCAB_SIZE, write_tiny_llama

KV_DTYPES = ["float16", "q8_0"]
CONFIG = ModelConfig(
    architecture="llama",
    num_layers=2,
    dim=128,
    ffn_dim=64,
    num_heads=2,
    num_kv_heads=2,
    head_dim=64,
    rms_eps=1e-5,
    rope_base=1e4,
    context_length=4096,
    vocab_size=VOCAB_SIZE,
)


def values(rng: np.random.Generator, n: int) -> np.ndarray:
    """Keys or values [layers, kv_heads, n, head_dim] in float32, of mixed scales, with
    blocks of zeros (a q8_0 scale of 0) and of one value repeated (codes of 127)."""
    c = CONFIG
    x = rng.standard_normal((c.num_layers, c.num_kv_heads, n, c.head_dim)).astype(np.float32)
    x *= np.float32(10) ** rng.integers(-3, 3, size=(1, 1, n, 1)).astype(np.float32)
    x[0, 0, 0, :32] = 0
    x[1, 1, 1, 32:] = -2.5
    return x


def host(x: np.ndarray, name: str) -> np.ndarray:
    """What the CPU path holds for float32 values in KV dtype `name`."""
    return quantize(x) if name == "q8_0" else x.astype(kv_dtype_named(name))


@pytest.mark.parametrize("name", KV_DTYPES)
def test_a_step_s_writes_hold_the_cpu_paths_bytes(name: str) -> None:
    """The pool quantizes (q8_0) or rounds (float16) what a step writes as the CPU path
    does, bit for bit; and what load puts in comes back out unchanged."""
    rng = np.random.default_rng(3)
    pool = MLXKVPool(CONFIG, 8, kv_dtype_named(name), mx, "fingerprint")
    k, v = values(rng, 37), values(rng, 37)
    written = pool.new_kv("tenant")
    written.prepare_write(0, 37)
    rows = mx.array(pool.rows(*written.slots(0, 37)))
    for layer in range(CONFIG.num_layers):  # [kv_heads, n, D] -> [n, kv_heads, D]
        pool.write(layer, rows, *(mx.array(a[layer].transpose(1, 0, 2)) for a in (k, v)))
    written.commit(list(range(37)))
    got_k, got_v, _ = written.state()
    assert got_k.dtype == kv_dtype_named(name)
    assert got_k.tobytes() == host(k, name).tobytes()
    assert got_v.tobytes() == host(v, name).tobytes()
    # a session read back from disk: blocks as they are, shared where the pool has them
    loaded = pool.load("tenant", host(k, name), host(v, name), list(range(37)))
    assert loaded.blocks[:2] == written.blocks[:2] and loaded.blocks[2] != written.blocks[2]
    back_k, back_v, ids = loaded.state()
    assert ids == list(range(37))
    assert back_k.tobytes() == got_k.tobytes() and back_v.tobytes() == got_v.tobytes()
    # attention reads the rows widened: q8_0's d * q, exact in float32
    read_k, _ = pool.read(1, rows, mx.float32)
    expected = widened(host(k, name))[1].transpose(1, 0, 2)
    assert np.array_equal(np.array(read_k), expected)


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Heads of 32 values (q8_0 takes whole blocks of 32)."""
    return write_tiny_llama(tmp_path_factory.mktemp("kv") / "m.gguf", dim=128, num_heads=4)


# MLX and NumPy keys differ by ~1e-6 before rounding: now and then a value one float16 step
# or one q8_0 code apart. Measured: 3e-4 (float16), 6e-6 (q8_0: no code apart) on logits
# up to ~10; a code apart moves them by ~1e-2.
LOGITS_ATOL = {"float16": 2e-3, "q8_0": 2e-2}


@pytest.mark.parametrize("name", KV_DTYPES)
def test_steps_give_the_cpu_paths_logits_and_tokens(tiny_file: Path, name: str) -> None:
    on_mlx = Model.load(tiny_file, device="mlx", kv_dtype=name)
    on_cpu = Model.load(tiny_file, device="cpu", weights="float32", kv_dtype=name)
    assert kv_name(on_mlx.kv_dtype) == kv_name(on_cpu.kv_dtype) == name
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(3, VOCAB_SIZE, size=n)] for n in (40, 19)]
    for model in (on_mlx, on_cpu):
        a, b = new_kv(model), new_kv(model)
        first = run_segments(model, [(a, prompts[0]), (b, prompts[1])])
        ids = [int(t) for t in first.argmax(-1)]
        rows = [first]
        for _ in range(6):  # greedy decode, both sessions in each step
            out = run_segments(model, [(a, [ids[-2]]), (b, [ids[-1]])])
            ids += [int(t) for t in out.argmax(-1)]
            rows.append(out)
        if model is on_mlx:
            mlx_ids, mlx_logits = ids, np.concatenate(rows)
        a.release()
        b.release()
    assert ids == mlx_ids
    np.testing.assert_allclose(mlx_logits, np.concatenate(rows), rtol=0, atol=LOGITS_ATOL[name])


def test_mlx_takes_every_kv_dtype_and_defaults_to_float16() -> None:
    f32, f16 = np.dtype(np.float32), np.dtype(np.float16)
    assert kv_dtype_for("auto", f32, mx) == f16 and kv_dtype_for("auto", f16, mx) == f16
    assert kv_dtype_for("q8_0", f16, mx) == Q8_0 and kv_dtype_for("float32", f16, mx) == f32
    assert kv_dtype_for("auto", f32, ModuleType("cupy")) == f32  # CUDA: the compute dtype
