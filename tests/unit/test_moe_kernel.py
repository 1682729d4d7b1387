"""A step's mixture-of-experts FFN in one C call (engine/ops/csrc/moe.c), as llama.cpp's
qwen3moe computes it: each row's output the same bits whatever rows share the step or how
many threads run, in integer and in float32 products, within a stated bound of a float64
computation of the same semantics, ties in the router sent to the lower expert, the experts
touched counted, and scratch it cannot have refused with nothing done."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from engine.ops.moe import moe_ffn_gpt_oss
from engine.ops.quant.experts import GptOssExperts, MoEWeights
from engine.ops.quant.experts_native import MoEKernel, Products, load
from tests.unit.expert_cases import (
    INT_TYPES,
    MOE_SHAPES,
    MoEShape,
    Reference,
    T,
    experts_of,
    moe_reference,
    random_experts,
    random_moe,
)

pytestmark = pytest.mark.skipif(load() is None, reason="no C compiler here")
BY_PRODUCTS = pytest.mark.parametrize("products", Products, ids=lambda p: p.name.lower())


def build(shape: MoEShape, products: Products = Products.INTEGER) -> MoEKernel:
    kernels = load()
    assert kernels is not None
    return random_moe(shape, kernels, products=products)


def reference(kernel: MoEKernel, x: np.ndarray) -> Reference:
    return moe_reference(x, kernel.router, kernel.top_k, experts_of(kernel))


def rows(kernel: MoEKernel, n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, kernel.dim)).astype(np.float32)


@BY_PRODUCTS
@pytest.mark.parametrize("shape", MOE_SHAPES, ids=lambda s: f"{s[0].name}-{s[1].name}")
def test_each_rows_output_is_the_same_bits_whatever_rows_share_the_step(
    shape: MoEShape, products: Products
) -> None:
    kernel = build(shape, products)
    x = rows(kernel, 16)
    together = kernel.run(x, threads=2)
    assert np.array_equal(kernel.run(x, threads=1).view(np.uint32), together.view(np.uint32))
    for i in range(len(x)):
        alone = kernel.run(x[i : i + 1], threads=2)
        assert np.array_equal(alone[0].view(np.uint32), together[i].view(np.uint32)), f"row {i}"
    half = kernel.run(x[5:13], threads=2)  # rows at other places in a smaller step
    assert np.array_equal(half.view(np.uint32), together[5:13].view(np.uint32))


@BY_PRODUCTS
@pytest.mark.parametrize("shape", MOE_SHAPES, ids=lambda s: f"{s[0].name}-{s[1].name}")
def test_outputs_are_within_the_bound_of_a_float64_computation(
    shape: MoEShape, products: Products
) -> None:
    """The bound (expert_cases.moe_reference): each product's (Product.bound: float32's
    gamma_K |W| |x|, or the activations' rounding to 8 bits and the float steps') carried
    through silu(g) * u and the down product, the routing weights' error from the logits',
    and the k adds; the router's choice must be clear of the logits' error."""
    kernel = build(shape, products)
    x = rows(kernel, 16)
    ref = reference(kernel, x)
    assert np.all(ref.margin > 1e-3), "the seed gives a near-tie: routing would be unstable"
    err = np.abs(kernel.run(x, threads=2) - ref.out)
    assert np.all(err <= ref.bound)
    top = np.abs(ref.out).max()
    if products == Products.INTEGER and shape[0] in INT_TYPES:
        # every 8-bit rounding aligned is no tight bound on these random blocks' cancelling
        # weights: their error itself, typically well under 1% of the largest output
        assert np.median(err) <= 1e-2 * top
    else:
        # worst-case first-order rounding, not a tolerance picked to pass: under 0.5% of the
        # largest output even with these random blocks' cancellations
        assert ref.bound.max() <= 5e-3 * top


def test_calls_experts_and_bytes_are_counted() -> None:
    kernel = build(MOE_SHAPES[0])
    x = rows(kernel, 16)
    chosen = reference(kernel, x).chosen
    per_expert = sum(w.expert_bytes for w in (kernel.gate, kernel.up, kernel.down))
    stats = np.zeros(3, np.int64)
    kernel.run(x, threads=2, stats=stats)
    touched = len(np.unique(chosen))
    assert list(stats) == [1, touched, touched * per_expert]
    kernel.run(x[:1], threads=2, stats=stats)
    assert list(stats) == [2, touched + kernel.top_k, (touched + kernel.top_k) * per_expert]


def test_a_tie_in_the_router_goes_to_the_lower_expert() -> None:
    """x = e_0 makes each logit router[e, 0] exactly: experts 2 and 5 tie for the last place
    (float32 products: their tight bound tells the two experts' outputs apart)."""
    base = build(MOE_SHAPES[0])
    router = base.router.copy()
    router[:, 0] = [0.1, 2.0, 1.0, -0.5, 3.0, 1.0, -1.0, 0.0]
    kernel = MoEKernel(router, 3, base.gate, base.up, base.down, base.kernels, Products.FLOAT)
    x = np.zeros((1, kernel.dim), np.float32)
    x[0, 0] = 1.0
    got = kernel.run(x, threads=2)
    lower = reference(kernel, x)
    assert list(lower.chosen[0]) == [4, 1, 2]
    assert np.all(np.abs(got - lower.out) <= lower.bound)
    router[5, 0] = np.nextafter(np.float32(1.0), np.float32(2.0))  # 5 ahead of 2 instead
    higher = moe_reference(x, router, 3, experts_of(kernel))
    assert list(higher.chosen[0]) == [4, 1, 5]
    assert np.abs(got - higher.out).max() > 100 * higher.bound.max()


def test_shapes_that_do_not_fit_are_refused() -> None:
    kernel = build(MOE_SHAPES[1])
    with pytest.raises(ValueError):  # down's [dim, ffn] given as gate
        MoEKernel(kernel.router, 2, kernel.down, kernel.up, kernel.down, kernel.kernels)
    with pytest.raises(ValueError):
        MoEKernel(kernel.router, 6, kernel.gate, kernel.up, kernel.down, kernel.kernels)
    with pytest.raises(ValueError):
        kernel.run(np.ones((2, kernel.dim + 32), np.float32), threads=1)


REFUSED = """
import resource
import numpy as np
from engine.ops.quant.experts_native import load
from tests.unit.expert_cases import random_moe
from tests.unit.quant_cases import T

kernel = random_moe((T.Q8_0, T.Q8_0, 2, 2, 2048, 768), load())
x = np.ones((8192, 2048), np.float32)  # 16,384 pairs: ~235 MB of scratch
out = np.full_like(x, 7.0)
with open("/proc/self/status") as f:
    size = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + (64 << 20), resource.RLIM_INFINITY))
try:
    kernel.kernels.moe_ffn(kernel.struct, x, out, 2, None)
    print("no error")
except MemoryError as e:
    print("MemoryError", "untouched" if (out == 7.0).all() else "written", e)
"""


def test_scratch_it_cannot_have_is_refused_with_nothing_done() -> None:
    """Under an address-space limit that leaves no room for the step's scratch: MemoryError,
    the output as it was, and the worker alive (a child process here)."""
    done = subprocess.run(
        [sys.executable, "-c", REFUSED], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("MemoryError untouched"), done.stdout
    assert "wf_moe_ffn" in done.stdout


@BY_PRODUCTS
def test_gpt_oss_experts_match_the_numpy_form_and_each_row_is_alone(products: Products) -> None:
    """gpt-oss's variant (router and expert biases, the top 4 by raw logit weighted by
    their softmax, the clamped SwiGLU) in MXFP4 experts: the C kernel against
    engine/ops/moe.py's NumPy form of it (float32 products there, so within the 8-bit
    activations' rounding for integer products here), and each row's bits its own."""
    kernels = load()
    assert kernels is not None
    rng = np.random.default_rng(4)
    e, k, dim, ffn = 8, 4, 128, 64
    gate, up = (random_experts(rng, T.MXFP4, e, ffn, dim) for _ in range(2))
    down = random_experts(rng, T.MXFP4, e, dim, ffn)
    router = (rng.standard_normal((e, dim)) / np.sqrt(dim)).astype(np.float32)
    biases = [
        rng.standard_normal(s).astype(np.float32) for s in ((e,), (e, ffn), (e, ffn), (e, dim))
    ]
    extra = GptOssExperts(*biases)
    kernel = MoEKernel(router, k, gate, up, down, kernels, products, gpt_oss=extra)
    weights = MoEWeights(router, gate, up, down, k, gpt_oss=extra)
    x = rows(kernel, 16)
    together = kernel.run(x, threads=2)
    want = moe_ffn_gpt_oss(x, weights, extra)
    tol = 2e-5 if products == Products.FLOAT else 5e-2
    np.testing.assert_allclose(together, want, atol=tol * np.abs(want).max(), rtol=0)
    for i in range(len(x)):
        alone = kernel.run(x[i : i + 1], threads=1)
        assert np.array_equal(alone[0].view(np.uint32), together[i].view(np.uint32)), f"row {i}"
    # 8 experts of 4 a row: some over 7, where the SwiGLU clamps
    gates = np.stack([gate.dense(i) for i in range(e)]) @ x.T  # [e, ffn, rows]
    assert (gates > 7).any()
