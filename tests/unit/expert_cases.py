"""Random expert tensors of every type the grouped kernels read (engine/ops/csrc/experts.c),
the pairs that route activation rows to them, and a float64 reference of the MoE FFN
(moe.c's semantics, llama.cpp's qwen3moe). Shared by the kernels' tests and the AVX2 build's.

Shapes: E experts of [N, K]; P pairs bucketed by expert.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np

from engine.ops.quant.experts import EXPERT_TYPES, ExpertMatrix
from engine.ops.quant.experts_native import ExpertKernels, MoEKernel
from tests.unit.quant_cases import K_QUANTS, T, U, random_blocks

E, N, K = 6, 37, 512  # 37 rows: the last task of 4 rows is short
BUCKETS = (0, 1, 2, 5, 17, 33)  # pairs per expert: empty, the fused paths, tiles and tails
TYPES = EXPERT_TYPES


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


# a MoE layer: (gate and up type, down type, experts, top_k, dim, ffn)
MoEShape = tuple[T, T, int, int, int, int]
MOE_SHAPES: list[MoEShape] = [(T.Q4_K, T.Q6_K, 8, 3, 256, 512), (T.Q8_0, T.BF16, 5, 2, 96, 64)]


def random_moe(shape: MoEShape, kernels: ExpertKernels, seed: int = 0) -> MoEKernel:
    gate_up, down, e, top_k, dim, ffn = shape
    rng = np.random.default_rng(seed)
    router = (rng.standard_normal((e, dim)) / np.sqrt(dim)).astype(np.float32)
    gate, up = (random_experts(rng, gate_up, e, ffn, dim) for _ in range(2))
    return MoEKernel(router, top_k, gate, up, random_experts(rng, down, e, dim, ffn), kernels)


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


def moe_reference(
    x: np.ndarray,
    router: np.ndarray,
    top_k: int,
    dense: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]],
) -> Reference:
    """dense: each expert's gate, up [ffn, dim] and down [dim, ffn] as float32."""
    gate, up, down = dense
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
    x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One expert's output for a row in float64, and the bound of its float32 computation:
    the products' summation bounds carried through silu(g) * u (|silu'| < 1.1) and down."""
    g, u = gate.astype(np.float64) @ x, up.astype(np.float64) @ x
    dg = gamma(len(x)) * (np.abs(gate).astype(np.float64) @ np.abs(x))
    du = gamma(len(x)) * (np.abs(up).astype(np.float64) @ np.abs(x))
    silu = g * 0.5 * (1 + np.tanh(g / 2))  # g / (1 + e^-g), without overflow
    h = silu * u
    dh = 1.1 * dg * (np.abs(u) + du) + np.abs(silu) * du + 6 * U * np.abs(h)
    wd = down.astype(np.float64)
    d = wd @ h
    d_bound = gamma(len(h)) * (np.abs(wd) @ (np.abs(h) + dh)) + np.abs(wd) @ dh
    return d, d_bound
