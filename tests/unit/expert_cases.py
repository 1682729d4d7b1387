"""Random expert tensors of every type the grouped kernels read (engine/ops/csrc/experts.c),
the pairs that route activation rows to them, the bound of a product against float64
(float32 products, or integer ones on int8 activations: experts_int.c), and a float64
reference of the MoE FFN (moe.c's semantics, llama.cpp's qwen3moe). Shared by the kernels'
tests and the other builds'.

Shapes: E experts of [N, K]; P pairs bucketed by expert.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np

from engine.ops.quant.experts import EXPERT_TYPES, ExpertMatrix
from engine.ops.quant.experts_native import ExpertKernels, MoEKernel, Products
from tests.unit.quant_cases import K_QUANTS, T, U, random_blocks

E, N, K = 6, 37, 512  # 37 rows: the last task of 4 rows is short
BUCKETS = (0, 1, 2, 5, 17, 33)  # pairs per expert: empty, the fused paths, tiles and tails
TYPES = EXPERT_TYPES
FLOAT_TYPES = (T.F32, T.F16, T.BF16)  # float32 products whatever the switch says
INT_TYPES = tuple(t for t in TYPES if t not in FLOAT_TYPES)
MIN_AT = {T.Q4_1: 2, T.Q5_1: 2, T.Q4_K: 2, T.Q5_K: 2}  # byte of a block's f16 min (dmin)


def random_experts(
    rng: np.random.Generator, qtype: T, e: int = E, n: int = N, k: int = K
) -> ExpertMatrix:
    """[e, n, k] experts of `qtype`: random valid blocks for the K-quants, gguf's own
    quantization of normal values for the rest, float values as they are."""
    if qtype in K_QUANTS:
        raw = random_blocks(rng, qtype, e * n, k)
    elif qtype == T.F32:
        raw = rng.standard_normal((e * n, k)).astype(np.float32).view(np.uint8)
    else:
        values = rng.standard_normal((e * n, k)).astype(np.float32)
        raw = np.ascontiguousarray(gguf.quants.quantize(values, qtype)).view(np.uint8)
    return ExpertMatrix(qtype, np.ascontiguousarray(raw.reshape(e, n, -1)), k)


def integer(qtype: T, products: Products) -> bool:
    """Whether the kernels multiply `qtype` in integers under `products`."""
    return products == Products.INTEGER and qtype not in FLOAT_TYPES


def act_block(qtype: T) -> int:
    """The activation block of the integer products: a K-quant's super-block, else 32."""
    return 256 if qtype in K_QUANTS else 32


@dataclass(frozen=True, slots=True)
class Product:
    """One expert's [N, K] matrix as the kernels multiply it: gguf's float32 dequantization,
    |its scale part| + |its min part| (the min zeroed in the file's blocks gives the first),
    and the integer products' activation block (0: float32 products)."""

    dense: np.ndarray
    magnitude: np.ndarray
    block: int
    has_min: bool

    @classmethod
    def of(cls, w: ExpertMatrix, e: int, products: Products) -> Product:
        dense = w.dense(e)
        if not integer(w.qtype, products):
            return cls(dense, np.abs(dense), 0, False)
        if w.qtype not in MIN_AT:
            return cls(dense, np.abs(dense), act_block(w.qtype), False)
        block, size = gguf.GGML_QUANT_SIZES[w.qtype]
        raw = w.data[e].reshape(w.n, w.k // block, size).copy()
        raw[..., MIN_AT[w.qtype] : MIN_AT[w.qtype] + 2] = 0
        scaled = ExpertMatrix(w.qtype, raw.reshape(1, w.n, -1), w.k).dense(0)
        magnitude = np.abs(scaled) + np.abs(dense.astype(np.float64) - scaled)
        return cls(dense, magnitude, act_block(w.qtype), True)

    def bound(self, x: np.ndarray, dx: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """y = W @ x in float64 for one row x [K], and how far the kernel's output may be from
        it for any input within dx of x. Float32 products: gamma_K |W| |x|. Integer ones: each
        activation within d_b / 2 of its 8-bit value (d_b = the block's amax / 127), and the
        float steps' roundings, gamma_(steps + 2) of |scale part| + |min part| against the
        8-bit activations; the float32 weights' own rounding (u |W|) beside."""
        w = self.dense.astype(np.float64)
        y, top = w @ x, np.abs(x) + dx
        if not self.block:
            return y, gamma(len(x)) * (np.abs(w) @ top) + np.abs(w) @ (top - np.abs(x))
        amax = top.reshape(-1, self.block).max(axis=1) * (1 + 4 * U)
        half = np.repeat(amax / 127 / 2 * (1 + 2.0**-14), self.block)
        steps = len(x) // self.block * (2 if self.has_min else 1)
        mag = self.magnitude.astype(np.float64) * (1 + 4 * U)
        act = (np.abs(w) * (1 + 2 * U)) @ (top - np.abs(x) + half)
        return y, act + gamma(steps + 2) * (mag @ (top + half)) + 2 * U * (np.abs(w) @ top)


def quantize_rows(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """experts_int.c's activation quantization in NumPy: q int8 [R, K], d [R, K / block]."""
    xb = x.astype(np.float32).reshape(len(x), -1, block)
    d = (np.abs(xb).max(axis=2) / np.float32(127)).astype(np.float32)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.clip(np.rint(xb * inverse[..., None]), -127, 127).astype(np.int8)
    return q.reshape(len(x), -1), d


# a MoE layer: (gate and up type, down type, experts, top_k, dim, ffn)
MoEShape = tuple[T, T, int, int, int, int]
MOE_SHAPES: list[MoEShape] = [(T.Q4_K, T.Q6_K, 8, 3, 256, 512), (T.Q8_0, T.BF16, 5, 2, 96, 64)]


def random_moe(
    shape: MoEShape,
    kernels: ExpertKernels,
    seed: int = 0,
    products: Products = Products.INTEGER,
) -> MoEKernel:
    gate_up, down, e, top_k, dim, ffn = shape
    rng = np.random.default_rng(seed)
    router = (rng.standard_normal((e, dim)) / np.sqrt(dim)).astype(np.float32)
    gate, up = (random_experts(rng, gate_up, e, ffn, dim) for _ in range(2))
    down_w = random_experts(rng, down, e, dim, ffn)
    return MoEKernel(router, top_k, gate, up, down_w, kernels, products)


def starts_of(counts: np.ndarray | list[int] | tuple[int, ...]) -> np.ndarray:
    """Pairs per expert -> the bucket bounds [E + 1]."""
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def bits(a: np.ndarray) -> np.ndarray:
    """float32 values as their bits, a zero's sign dropped (a sum of products is +0 whatever
    the signs of the zero weights in it)."""
    return (np.asarray(a, np.float32) + np.float32(0)).view(np.uint32)


@dataclass(frozen=True, slots=True)
class Reference:
    """The MoE FFN of rows in float64 on the kernels' float32 weights, and a bound on how far
    a float32 computation of the same steps may be from it."""

    out: np.ndarray  # [R, dim]
    bound: np.ndarray  # [R, dim]
    chosen: np.ndarray  # [R, top_k] experts in rank order
    margin: np.ndarray  # [R] log-probability gap between the k-th and the (k+1)-th expert


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


Experts = tuple[list[Product], list[Product], list[Product]]


def experts_of(kernel: MoEKernel) -> Experts:
    """Each expert's gate, up and down as the kernel multiplies them."""
    gate, up, down = (
        [Product.of(w, e, kernel.products) for e in range(w.num_experts)]
        for w in (kernel.gate, kernel.up, kernel.down)
    )
    return gate, up, down


def moe_reference(x: np.ndarray, router: np.ndarray, top_k: int, experts: Experts) -> Reference:
    """experts: each expert's gate, up [ffn, dim] and down [dim, ffn]."""
    gate, up, down = experts
    e, dim = router.shape
    x64 = x.astype(np.float64)
    logits = x64 @ router.T.astype(np.float64)
    dlogit = gamma(dim) * (np.abs(x64) @ np.abs(router.T.astype(np.float64)))
    order = np.argsort(-logits, axis=1, kind="stable")  # ties: the lower expert first
    chosen = order[:, :top_k]
    ranked = np.take_along_axis(logits, order, axis=1)
    margin = ranked[:, top_k - 1] - ranked[:, top_k] if top_k < e else np.full(len(x), np.inf)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    out, bound = np.zeros_like(x64), np.zeros_like(x64)
    for i in range(len(x)):
        sel = chosen[i]
        w = probs[i, sel] / probs[i, sel].sum()
        # relative error of a renormalised weight: the logits' errors, e^ and the sums' roundings
        w_err = 2 * dlogit[i, sel].max() + (e + top_k + 8) * U
        for j, ex in enumerate(sel):
            d, d_bound = _expert(x64[i], gate[ex], up[ex], down[ex])
            out[i] += w[j] * d
            bound[i] += w[j] * (d_bound + (w_err + (top_k + 1) * U) * np.abs(d))
    return Reference(out, bound, chosen, margin)


def _expert(
    x: np.ndarray, gate: Product, up: Product, down: Product
) -> tuple[np.ndarray, np.ndarray]:
    """One expert's output for a row in float64, and the bound of the kernels' computation:
    the products' bounds (Product.bound) carried through silu(g) * u (|silu'| < 1.1) and
    down."""
    (g, dg), (u, du) = gate.bound(x), up.bound(x)
    silu = g * 0.5 * (1 + np.tanh(g / 2))  # g / (1 + e^-g), without overflow
    h = silu * u
    dh = 1.1 * dg * (np.abs(u) + du) + np.abs(silu) * du + 6 * U * np.abs(h)
    return down.bound(h, dh)


def grouped(
    kernels: ExpertKernels,
    w: ExpertMatrix,
    x: np.ndarray,
    counts: list[int],
    rows: np.ndarray,
    threads: int = 2,
    products: Products = Products.INTEGER,
) -> np.ndarray:
    """out [P, N] of the pairs `rows`, bucketed by `counts`."""
    out = np.full((len(rows), w.n), np.nan, np.float32)
    kernels.matmul(w, x, rows, starts_of(counts), out, threads, products)
    return out
