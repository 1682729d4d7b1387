"""The engine's forward pass against a plain NumPy float64 reference on tiny random models.

The reference reads the GGUF tensors itself, loops over heads, applies rope to adjacent pairs
(2i, 2i+1) of the file's own Q/K layout (ggml's normal rope mode) and masks with an explicit
causal mask. It shares no code with engine/forward.py or engine/loader/weights.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from engine.model import Model
from tests.paged import new_kv, pool_of, run_segments
from tests.tiny_gguf import VOCAB_SIZE, write_tiny_llama

ATOL = 1e-4
PROMPT = [int(t) for t in np.random.default_rng(42).integers(3, VOCAB_SIZE, size=17)]


@dataclass
class Reference:
    tensors: dict[str, np.ndarray]  # float64, numpy [out, in]
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_base: float
    rms_eps: float


def read_reference(path: Path) -> Reference:
    reader = gguf.GGUFReader(path)
    meta = {name: f.contents() for name, f in reader.fields.items()}
    tensors = {
        t.name: np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)
        for t in reader.tensors
    }
    num_heads = int(meta["llama.attention.head_count"])
    return Reference(
        tensors=tensors,
        num_layers=int(meta["llama.block_count"]),
        num_heads=num_heads,
        num_kv_heads=int(meta["llama.attention.head_count_kv"]),
        head_dim=int(meta["llama.embedding_length"]) // num_heads,
        rope_base=float(meta["llama.rope.freq_base"]),
        rms_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
    )


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope_pairs(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """Rotate each adjacent pair (x[2i], x[2i+1]) by position * base^(-2i/D). x: [T, D]."""
    d = x.shape[-1]
    angles = positions[:, None] * base ** (-np.arange(0, d, 2) / d)[None, :]  # [T, D/2]
    cos, sin = np.cos(angles), np.sin(angles)
    out = np.empty_like(x)
    even, odd = x[:, 0::2], x[:, 1::2]
    out[:, 0::2] = even * cos - odd * sin
    out[:, 1::2] = even * sin + odd * cos
    return out


def rope_halves(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """HF rotate_half on the file's layout as is: the wrong mode for GGUF llama weights."""
    d = x.shape[-1]
    angles = positions[:, None] * base ** (-np.arange(0, d, 2) / d)[None, :]
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)
    rotated = np.concatenate([-x[:, d // 2 :], x[:, : d // 2]], axis=-1)
    return x * cos + rotated * sin


def reference_logits(ref: Reference, ids: list[int], *, pairs: bool = True) -> np.ndarray:
    """Logits [T, vocab] at every position of `ids`, float64."""
    w = ref.tensors
    rope = rope_pairs if pairs else rope_halves
    n, d = len(ids), ref.head_dim
    positions = np.arange(n, dtype=np.float64)
    group = ref.num_heads // ref.num_kv_heads
    future = np.triu(np.ones((n, n), dtype=bool), k=1)
    x = w["token_embd.weight"][ids]  # [T, dim]
    for layer in range(ref.num_layers):
        p = f"blk.{layer}."
        h = rms_norm(x, w[p + "attn_norm.weight"], ref.rms_eps)
        q, k, v = (
            h @ w[p + name].T for name in ("attn_q.weight", "attn_k.weight", "attn_v.weight")
        )
        heads = []
        for head in range(ref.num_heads):
            kv = head // group
            qh = rope(q[:, head * d : (head + 1) * d], positions, ref.rope_base)
            kh = rope(k[:, kv * d : (kv + 1) * d], positions, ref.rope_base)
            vh = v[:, kv * d : (kv + 1) * d]
            scores = qh @ kh.T / np.sqrt(d)  # [T, T]
            scores[future] = -np.inf
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            heads.append(probs @ vh)
        x = x + np.concatenate(heads, axis=-1) @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], ref.rms_eps)
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
    out = w.get("output.weight", w["token_embd.weight"])
    return rms_norm(x, w["output_norm.weight"], ref.rms_eps) @ out.T


VARIANTS: dict[str, dict[str, Any]] = {
    "f32-untied": {},
    "q8-tied": {"matrix_type": gguf.GGMLQuantizationType.Q8_0, "tie_embeddings": True},
    "f32-mha-3layers": {"num_layers": 3, "num_kv_heads": 4, "rope_base": 500.0, "seed": 3},
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def case(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Model, Reference]:
    path = write_tiny_llama(tmp_path_factory.mktemp("fwd") / "m.gguf", **VARIANTS[request.param])
    # float32 KV, as the reference: float16's rounding is past these tests' tolerance
    return Model.load(path, device="cpu", kv_dtype="float32"), read_reference(path)


def test_decode_matches_reference_at_every_position(case: tuple[Model, Reference]) -> None:
    model, ref = case
    expected = reference_logits(ref, PROMPT)
    cache = new_kv(model)
    got = np.concatenate([run_segments(model, [(cache, [t])]) for t in PROMPT])
    assert got.shape == (len(PROMPT), model.config.vocab_size)
    assert np.abs(got - expected).max() < ATOL
    assert np.array_equal(got.argmax(-1), expected.argmax(-1))


def test_batched_prefill_of_every_prefix_matches_reference(
    case: tuple[Model, Reference],
) -> None:
    """One batch whose segments are the prompt's prefixes 1..T, each in its own cache: the
    causal mask and the segment bookkeeping give the reference's row at each position."""
    model, ref = case
    expected = reference_logits(ref, PROMPT)
    parts = [(new_kv(model), PROMPT[:n]) for n in range(1, len(PROMPT) + 1)]
    got = run_segments(model, parts)
    assert np.abs(got - expected).max() < ATOL


def test_reference_would_catch_split_half_rope(case: tuple[Model, Reference]) -> None:
    """The tolerance is meaningful: rope on split halves of the file's layout is far off."""
    model, ref = case
    wrong = reference_logits(ref, PROMPT, pairs=False)
    got = run_segments(model, [(new_kv(model), PROMPT)])[0]
    assert np.abs(got - wrong[-1]).max() > 100 * ATOL


def test_chunked_prefill_equals_one_shot(case: tuple[Model, Reference]) -> None:
    model, ref = case
    one_shot = run_segments(model, [(new_kv(model), PROMPT)])[0]
    cache = new_kv(model)
    chunks = [PROMPT[i : i + 3] for i in range(0, len(PROMPT), 3)]
    last = [run_segments(model, [(cache, chunk)])[0] for chunk in chunks][-1]
    assert np.abs(last - one_shot).max() < 1e-5
    assert np.abs(last - reference_logits(ref, PROMPT)[-1]).max() < ATOL
    assert cache.offset == len(PROMPT) and cache.token_ids == PROMPT


def test_mixed_decode_and_prefill_batch_equals_separate_runs(
    case: tuple[Model, Reference],
) -> None:
    model, _ = case
    a, b = PROMPT[:9], PROMPT[4:15]
    solo_a, solo_b = new_kv(model), new_kv(model)
    run_segments(model, [(solo_a, a[:-1])])
    alone = [run_segments(model, [(solo_a, a[-1:])])[0], run_segments(model, [(solo_b, b)])[0]]
    cache_a, cache_b = new_kv(model), new_kv(model)
    run_segments(model, [(cache_a, a[:-1])])
    together = run_segments(model, [(cache_a, a[-1:]), (cache_b, b)])
    assert np.array_equal(together, np.stack(alone))
    assert cache_a.token_ids == a and cache_b.token_ids == b


def test_block_table_offset_ids_and_bytes(case: tuple[Model, Reference]) -> None:
    model, _ = case
    cfg = model.config
    kv = new_kv(model)
    bytes_per_token = 2 * cfg.num_layers * cfg.kv_dim * 4
    block = kv.pool.block_size
    assert kv.bytes_per_token == bytes_per_token and block == 16
    assert (kv.offset, kv.token_ids, kv.nbytes) == (0, [], 0)
    free = kv.pool.allocs[0].num_free
    run_segments(model, [(kv, PROMPT[:10])])
    assert kv.offset == 10 and kv.token_ids == PROMPT[:10]
    assert kv.capacity == block and kv.nbytes == block * bytes_per_token
    assert kv.pool.allocs[0].num_free == free - 1
    kv.reserve(33)
    assert kv.capacity == 48 and kv.nbytes == 3 * block * bytes_per_token
    assert kv.offset == 10 and kv.token_ids == PROMPT[:10]
    kv.compact()
    assert kv.capacity == block and kv.pool.allocs[0].num_free == free - 1
    kv.release()
    assert (kv.offset, kv.nbytes, kv.pool.allocs[0].num_free) == (0, 0, free)
    kv.pool.allocs[0].check()


def test_kv_survives_trim_state_roundtrip_and_fork(case: tuple[Model, Reference]) -> None:
    model, ref = case
    expected = reference_logits(ref, PROMPT)
    kv = new_kv(model)
    run_segments(model, [(kv, PROMPT[:10])])
    got = run_segments(model, [(kv, PROMPT[10:12])])[0]
    assert np.abs(got - expected[11]).max() < ATOL

    nbytes = kv.nbytes
    kv.trim(5)
    assert kv.offset == 5 and kv.token_ids == PROMPT[:5] and kv.nbytes == nbytes
    got = run_segments(model, [(kv, PROMPT[5:8])])[0]
    assert np.abs(got - expected[7]).max() < ATOL

    k, v, ids = kv.state()
    cfg = model.config
    assert k.shape == v.shape == (cfg.num_layers, cfg.num_kv_heads, 8, cfg.head_dim)
    assert ids == PROMPT[:8]
    restored = pool_of(model).load("", k, v, ids)
    assert restored.offset == 8 and restored.token_ids == PROMPT[:8]
    assert restored.blocks != kv.blocks  # a copy of its own
    got = run_segments(model, [(restored, PROMPT[8:])])[0]
    assert np.abs(got - expected[-1]).max() < ATOL

    before = restored.state()
    fork = restored.fork()  # 17 tokens: a full block, shared, and one more
    assert fork.blocks == restored.blocks and fork.token_ids == PROMPT
    fork.trim(12)
    # both shared blocks are copied before the writes; block 0, full again with the same
    # tokens, is the same as the original's and gives its copy back; block 1 stays its own
    got = run_segments(model, [(fork, PROMPT[12:])])[0]
    assert fork.blocks[0] == restored.blocks[0] and fork.blocks[1] != restored.blocks[1]
    assert np.abs(got - expected[-1]).max() < ATOL
    after = restored.state()  # the fork's writes went to its own copy
    assert np.array_equal(after[0], before[0]) and np.array_equal(after[1], before[1])
    for table in (kv, restored, fork):
        table.release()
    pool_of(model).alloc.check()


def test_float16_pool_bytes(tmp_path: Path) -> None:
    model = Model.load(write_tiny_llama(tmp_path / "m.gguf"), device="cpu", dtype="float16")
    kv = new_kv(model)
    run_segments(model, [(kv, PROMPT[:4])])
    assert pool_of(model).k.dtype == np.float16
    assert kv.bytes_per_token == 2 * 2 * 32 * 2
    assert kv.nbytes == 16 * 2 * 2 * 32 * 2
