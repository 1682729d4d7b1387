"""The mixture-of-experts FFN of a step on NumPy: every row routed (softmax over the
experts, the top k, their weights renormalised over the k), the (row, expert) pairs bucketed
by expert so that each touched expert is read once for all the rows routed to it, and each
row's k outputs added in the row's own ranking order, so a row's bits never depend on what
else is in the step. In the C kernels (engine/ops/csrc/experts.c) where they are built; else
here, each touched expert expanded and multiplied by the Numba kernel (slow: a fallback).

Shapes: N rows, E experts, k experts a row, P = N * k pairs.
"""

from __future__ import annotations

import numpy as np

from engine.ops.kernels import get_num_threads, matmul_t
from engine.ops.quant.experts import ExpertMatrix, MoEWeights


def route(logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's top_k experts by descending probability (ties: the lower index first) and
    their weights renormalised over the k: ([N, k] int64, [N, k] float32)."""
    shifted = logits - logits.max(axis=1, keepdims=True)  # [N, E]
    probs = np.exp(shifted)
    probs /= probs.sum(axis=1, keepdims=True)
    experts = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    chosen = np.take_along_axis(probs, experts, axis=1)
    total = chosen[:, 0].copy()
    for j in range(1, top_k):  # in rank order, as the C kernel sums them
        total += chosen[:, j]
    return experts.astype(np.int64), (chosen / total[:, None]).astype(np.float32)


def buckets(experts: np.ndarray, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """The pairs (row * k + rank) grouped by expert, in row then rank order within one
    ([P] int64), and where each expert's run starts ([E + 1] int64)."""
    flat = experts.reshape(-1)
    order = np.argsort(flat, kind="stable").astype(np.int64)
    starts = np.zeros(num_experts + 1, dtype=np.int64)
    np.cumsum(np.bincount(flat, minlength=num_experts), out=starts[1:])
    return order, starts


def grouped(w: ExpertMatrix, x: np.ndarray, rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """[P, w.n]: pair p (in bucket order) is x[rows[p]] through its bucket's expert."""
    out = np.empty((len(rows), w.n), dtype=np.float32)
    for e in np.flatnonzero(np.diff(starts)):
        lo, hi = int(starts[e]), int(starts[e + 1])
        out[lo:hi] = matmul_t(np.ascontiguousarray(x[rows[lo:hi]]), w.dense(int(e)))
    return out


def moe_ffn_numpy(x: np.ndarray, moe: MoEWeights) -> np.ndarray:
    """The experts' output [N, dim] for x [N, dim] (normed), without the residual."""
    n, k = x.shape[0], moe.top_k
    experts, weights = route(matmul_t(x, moe.router), k)
    order, starts = buckets(experts, moe.router.shape[0])
    rows = order // k  # the activation row of each pair, in bucket order
    gate, up = grouped(moe.gate, x, rows, starts), grouped(moe.up, x, rows, starts)
    hidden = gate / (np.float32(1) + np.exp(-gate)) * up  # [P, expert_ffn]
    down = grouped(moe.down, hidden, np.arange(len(rows), dtype=np.int64), starts)
    by_pair = np.empty_like(down)
    by_pair[order] = down  # [P, dim] back in (row, rank) order
    by_pair = by_pair.reshape(n, k, -1)
    acc = weights[:, 0:1] * by_pair[:, 0]
    for j in range(1, k):
        acc = acc + weights[:, j : j + 1] * by_pair[:, j]
    return acc


def moe_ffn(x: np.ndarray, moe: MoEWeights) -> np.ndarray:
    """The experts' output [N, dim] for x [N, dim] (normed), without the residual: in the
    C kernels where they are built, else in NumPy."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if moe.native is not None:
        out: np.ndarray = moe.native.run(x, get_num_threads(), moe.stats)
        return out
    return moe_ffn_numpy(x, moe)
