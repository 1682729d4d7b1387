"""The mixture-of-experts FFN of a step on NumPy: every row routed (softmax over the
experts, the top k, their weights renormalised over the k), the (row, expert) pairs bucketed
by expert so that each touched expert is read once for all the rows routed to it, and each
row's k outputs added in the row's own ranking order, so a row's bits never depend on what
else is in the step. In the C kernels (engine/ops/csrc/experts.c) where they are built; else
here, each touched expert expanded and multiplied by the Numba kernel (slow: a fallback).

gpt-oss's experts (MoEWeights.gpt_oss) route and activate otherwise: the top k by raw
logit (the router's bias added) weighted by the softmax of those k, biases after each
product, and SwiGLU clamped at SWIGLU_LIMIT with SiLU's slope SWIGLU_ALPHA: gate x = min(g,
limit), up y = clip(u, -limit, limit), x sigmoid(alpha x) (y + 1); in moe.c too.

Shapes: N rows, E experts, k experts a row, P = N * k pairs.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from engine.ops.kernels import get_num_threads, matmul_t
from engine.ops.quant.experts import ExpertMatrix, GptOssExperts, MoEWeights

SWIGLU_ALPHA, SWIGLU_LIMIT = np.float32(1.702), np.float32(7.0)  # gpt-oss's


def route(logits: Any, top_k: int, xp: ModuleType = np) -> tuple[Any, Any]:
    """Each row's top_k experts by descending probability (ties: the lower index first) and
    their weights renormalised over the k: ([N, k] int64, [N, k] float32), on NumPy or
    CuPy (whose sorts are stable too)."""
    shifted = logits - logits.max(axis=1, keepdims=True)  # [N, E]
    probs = xp.exp(shifted)
    probs /= probs.sum(axis=1, keepdims=True)
    experts = xp.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    chosen = xp.take_along_axis(probs, experts, axis=1)
    total = chosen[:, 0].copy()
    for j in range(1, top_k):  # in rank order, as the C kernel sums them
        total += chosen[:, j]
    return experts.astype(np.int64), (chosen / total[:, None]).astype(np.float32)


def route_top_logits(logits: Any, top_k: int, xp: ModuleType = np) -> tuple[Any, Any]:
    """gpt-oss's routing: each row's top_k experts by descending logit (ties: the lower
    index first) and the softmax of those k logits, summed in rank order."""
    experts = xp.argsort(-logits, axis=1, kind="stable")[:, :top_k]
    chosen = xp.take_along_axis(logits, experts, axis=1)
    e = xp.exp(chosen - chosen[:, :1])  # the first is the largest
    total = e[:, 0].copy()
    for j in range(1, top_k):
        total += e[:, j]
    return experts.astype(np.int64), (e / total[:, None]).astype(np.float32)


def buckets(experts: Any, num_experts: int, xp: ModuleType = np) -> tuple[Any, Any]:
    """The pairs (row * k + rank) grouped by expert, in row then rank order within one
    ([P] int64), and where each expert's run starts ([E + 1] int64), on NumPy or CuPy
    (nothing read back to the host)."""
    flat = experts.reshape(-1)
    order = xp.argsort(flat, kind="stable")
    starts = xp.searchsorted(flat[order], xp.arange(num_experts + 1), side="left")
    return order.astype(np.int64), starts.astype(np.int64)


def grouped(w: ExpertMatrix, x: np.ndarray, rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """[P, w.n]: pair p (in bucket order) is x[rows[p]] through its bucket's expert."""
    out = np.empty((len(rows), w.n), dtype=np.float32)
    for e in np.flatnonzero(np.diff(starts)):
        lo, hi = int(starts[e]), int(starts[e + 1])
        out[lo:hi] = matmul_t(np.ascontiguousarray(x[rows[lo:hi]]), w.dense(int(e)))
    return out


def swiglu_oai(gate: Any, up: Any, xp: ModuleType = np) -> Any:
    """gpt-oss's clamped SwiGLU of gate and up [P, ffn] (NumPy or CuPy arrays)."""
    x = xp.minimum(gate, SWIGLU_LIMIT)
    y = xp.clip(up, -SWIGLU_LIMIT, SWIGLU_LIMIT)
    return x / (np.float32(1) + xp.exp(-SWIGLU_ALPHA * x)) * (y + np.float32(1))


def moe_ffn_gpt_oss(x: np.ndarray, moe: MoEWeights, extra: GptOssExperts) -> np.ndarray:
    """gpt-oss's experts' output [N, dim] for x [N, dim] (normed), without the residual."""
    k = moe.top_k
    logits = matmul_t(x, moe.router) + extra.router_bias
    experts, weights = route_top_logits(logits, k)
    order, starts = buckets(experts, moe.router.shape[0])
    rows, by_expert = order // k, experts.reshape(-1)[order]  # each pair's row and expert
    gate = grouped(moe.gate, x, rows, starts) + extra.gate_bias[by_expert]
    up = grouped(moe.up, x, rows, starts) + extra.up_bias[by_expert]
    pairs = np.arange(len(rows), dtype=np.int64)
    down = grouped(moe.down, swiglu_oai(gate, up), pairs, starts)
    down += extra.down_bias[by_expert]
    touched = int(np.count_nonzero(np.diff(starts)))
    read = touched * sum(w.expert_bytes for w in (moe.gate, moe.up, moe.down))
    moe.stats[:] += (1, touched, read)
    return weigh(down, order, weights)


def weigh(down: Any, order: Any, weights: Any, xp: ModuleType = np) -> Any:
    """Each row's k outputs (down [P, dim] in bucket order) weighted and added in the row's
    own ranking order: [N, dim] (NumPy or CuPy arrays)."""
    n, k = weights.shape
    by_pair = xp.empty_like(down)
    by_pair[order] = down  # [P, dim] back in (row, rank) order
    by_pair = by_pair.reshape(n, k, -1)
    acc = weights[:, 0:1] * by_pair[:, 0]
    for j in range(1, k):
        acc = acc + weights[:, j : j + 1] * by_pair[:, j]
    return acc


def moe_ffn_numpy(x: np.ndarray, moe: MoEWeights) -> np.ndarray:
    """The experts' output [N, dim] for x [N, dim] (normed), without the residual."""
    k = moe.top_k
    experts, weights = route(matmul_t(x, moe.router), k)
    order, starts = buckets(experts, moe.router.shape[0])
    rows = order // k  # the activation row of each pair, in bucket order
    gate, up = grouped(moe.gate, x, rows, starts), grouped(moe.up, x, rows, starts)
    hidden = gate / (np.float32(1) + np.exp(-gate)) * up  # [P, expert_ffn]
    down = grouped(moe.down, hidden, np.arange(len(rows), dtype=np.int64), starts)
    return weigh(down, order, weights)


def moe_ffn(x: np.ndarray, moe: MoEWeights) -> np.ndarray:
    """The experts' output [N, dim] for x [N, dim] (normed), without the residual: in the
    C kernels where they are built, else in NumPy."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if moe.native is not None:
        out: np.ndarray = moe.native.run(x, get_num_threads(), moe.stats)
        return out
    if moe.gpt_oss is not None:
        return moe_ffn_gpt_oss(x, moe, moe.gpt_oss)
    return moe_ffn_numpy(x, moe)
