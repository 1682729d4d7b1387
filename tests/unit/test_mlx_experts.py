"""The mixture-of-experts layer on MLX (engine/mlx_backend/experts.py) on MLX's CPU build:
its routing against the NumPy path's, and the tiny Qwen 3 MoE (tests/tiny_families.py)
with its matrices Q8_0 and Q4_0, its experts held in MLX's quantized form, giving the
NumPy path's logits on the same file.

The logits bound: both paths hold the same weights exactly (each block's scale * code is
exact in float32) and route the same experts (the tiny model's router keeps each row's
k-th and k+1-th experts far apart), so they differ by float32 summation order alone. The
logits reach ~100; a row through a wrong expert, or a wrong weight, moves them by units.
"""

from __future__ import annotations

from collections.abc import Iterator

import gguf
import mlx.core as mx
import numpy as np
import pytest

from engine.mlx_backend.experts import MLXExperts, route
from engine.mlx_backend.quant import GROUP, MLXQuant
from engine.model import Model
from engine.ops.kernels import SMALL_ROWS
from engine.ops.moe import route as route_numpy
from engine.ops.quant.experts_native import PRODUCTS_ENV, expert_products
from tests.paged import new_kv, run_step
from tests.tiny_families import FAMILIES, write_tiny

T = gguf.GGMLQuantizationType
LOGITS_ATOL = 1e-3  # float32 summation order only (~1e-4 apart at logits of ~65)
BITS = {T.Q8_0: 8, T.Q4_0: 4}
NUM_EXPERTS, TOP_K, EXPERT_FFN = FAMILIES["qwen3moe"].experts or (0, 0, 0)


# 1. routing


def test_routing_picks_numpys_experts_and_weights_with_ties_to_the_lower_index() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((40, 16)).astype(np.float32) * 3
    logits[:10, [2, 5, 9]] = 8.0  # a three-way tie at the top: 2 and 5 go
    logits[10:20, [3, 11]] = logits[10:20].max(axis=1, keepdims=True)  # a tie for the 2nd
    for k in (1, 2, 4):
        experts, weights = route(mx.array(logits), k)
        want_experts, want_weights = route_numpy(logits, k)
        assert np.array_equal(np.array(experts), want_experts)
        np.testing.assert_allclose(np.array(weights), want_weights, rtol=0, atol=1e-6)
    assert np.array(route(mx.array(logits), 2)[0])[:10].tolist() == [[2, 5]] * 10


# 2. the tiny MoE model, quantized


@pytest.fixture(scope="module", autouse=True)
def float_products() -> Iterator[None]:
    """The NumPy side's expert products in float32, as MLX's are (the default quantizes
    the activations to 8 bits: ~1e-1 off at these logits)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(PRODUCTS_ENV, "float")
        expert_products.cache_clear()
        yield
    expert_products.cache_clear()


@pytest.fixture(scope="module", params=list(BITS), ids=lambda t: t.name)
def quantized_pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[T, Model, Model]:
    """The tiny MoE with every matrix of type request.param, on MLX and on NumPy."""
    qtype: T = request.param
    path = write_tiny(tmp_path_factory.mktemp("moe") / "m.gguf", "qwen3moe", matrix_type=qtype)
    cpu = Model.load(path, device="cpu", kv_dtype="float32")  # MLX's pool holds float32
    return qtype, Model.load(path, device="mlx", kv_dtype="float32"), cpu


def steps(model: Model) -> list[np.ndarray]:
    """Three prompts in one step (one longer than SMALL_ROWS, one wanting no logits), then
    a step of decode rows and a chunk: each step's logits."""
    rng = np.random.default_rng(7)
    vocab = model.config.vocab_size

    def draw(n: int) -> list[int]:
        return [int(t) for t in rng.integers(3, vocab, size=n)]

    a, b, c = (new_kv(model) for _ in range(3))
    first = run_step(
        model, [(a, draw(5), True), (b, draw(SMALL_ROWS + 4), True), (c, draw(3), False)]
    )
    second = run_step(model, [(a, draw(1), True), (c, draw(6), True), (b, draw(1), True)])
    third = run_step(model, [(c, draw(1), True)])
    for kv in (a, b, c):
        kv.release()
    return [first, second, third]


def test_the_experts_are_held_quantized_in_place_of_the_ffn(
    quantized_pair: tuple[T, Model, Model],
) -> None:
    qtype, on_mlx, _ = quantized_pair
    bits, dim = BITS[qtype], on_mlx.config.dim
    assert on_mlx.weights.quantized
    for lw in on_mlx.weights.layers:
        assert lw.w_gate_up is None and lw.w_down is None
        moe = lw.moe
        assert isinstance(moe, MLXExperts) and moe.top_k == TOP_K
        assert moe.router.dtype == mx.float32 and moe.router.shape == (NUM_EXPERTS, dim)
        shapes = {"gate": (EXPERT_FFN, dim), "up": (EXPERT_FFN, dim), "down": (dim, EXPERT_FFN)}
        for name, (n, k) in shapes.items():
            stack = getattr(moe, name)
            q = stack.part
            assert isinstance(q, MLXQuant) and q.bits == bits and stack.source == qtype.name
            assert q.wq.dtype == mx.uint32 and q.wq.shape == (NUM_EXPERTS, n, k * bits // 32)
            assert q.scales.shape == q.biases.shape == (NUM_EXPERTS, n, k // GROUP)
        # codes at `bits` a weight, a float32 scale and bias per 32, the float32 router
        per_weight = bits / 8 + 8 / GROUP
        expected = 3 * NUM_EXPERTS * EXPERT_FFN * dim * per_weight + NUM_EXPERTS * dim * 4
        assert moe.nbytes == expected
    w = on_mlx.weights  # the model's bytes: each layer's experts once, no dense FFN
    parts = [w.embed, w.out_norm] + ([] if w.output is w.embed else [w.output])
    for lw in w.layers:
        parts += [lw.attn_norm, lw.wqkv, lw.wo, lw.ffn_norm, lw.q_norm, lw.k_norm, lw.moe]
    assert w.nbytes == sum(int(p.nbytes) for p in parts)


def test_logits_match_the_numpy_path_on_the_same_file(
    quantized_pair: tuple[T, Model, Model],
) -> None:
    _, on_mlx, on_numpy = quantized_pair
    got, expected = steps(on_mlx), steps(on_numpy)
    vocab = on_mlx.config.vocab_size
    assert [g.shape for g in got] == [(2, vocab), (3, vocab), (1, vocab)]  # c wanted none at first
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=LOGITS_ATOL)
        assert np.array_equal(g.argmax(-1), e.argmax(-1))
