"""A mixture-of-experts layer on MLX: the router, and the gate, up and down matrices of all
E experts each stacked [E, N, K], in MLX's affine form where the file's blocks are one
(quant.py) and dense in the compute dtype otherwise; and the FFN of a step's rows, routed
as engine/ops/moe.py routes them, with one gathered product per matrix (each row's k
experts picked by index), so all rows' experts run in three calls.

Shapes: N rows, E experts, k experts a row, F an expert's FFN width, K a product's inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from engine.mlx_backend.quant import BITS, GROUP, MLXQuant, pack
from engine.ops.moe import SWIGLU_ALPHA, SWIGLU_LIMIT
from engine.ops.quant.experts import ExpertMatrix, MoEWeights
from engine.ops.quant.formats import decode


@dataclass(frozen=True, slots=True)
class ExpertStack:
    """E experts' [N, K] matrices: an MLXQuant of [E, N, ...] arrays, or an mx.array
    [E, N, K] in the compute dtype."""

    part: Any
    source: str  # the GGUF type it came from, e.g. "Q8_0"

    @property
    def quantized(self) -> bool:
        return isinstance(self.part, MLXQuant)

    @property
    def arrays(self) -> tuple[Any, ...]:
        return self.part.arrays if isinstance(self.part, MLXQuant) else (self.part,)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)

    def gather(self, x: Any, experts: Any) -> Any:
        """x [N, 1, 1, K] (or [N, k, 1, K]) through each row's experts [N, k]: [N, k, 1, N]."""
        q = self.part
        if isinstance(q, MLXQuant):
            return mx.gather_qmm(
                x, *q.arrays, rhs_indices=experts, transpose=True, group_size=GROUP, bits=q.bits
            )
        return mx.gather_mm(x, q.swapaxes(-1, -2), rhs_indices=experts)


@dataclass(frozen=True, slots=True)
class MLXExperts:
    """One layer's experts on MLX (engine/loader/experts.py's MoEWeights in MLX's form)."""

    router: Any  # [E, dim] float32
    gate: ExpertStack  # [E, F, dim]
    up: ExpertStack  # [E, F, dim]
    down: ExpertStack  # [E, dim, F]
    top_k: int
    # gpt-oss's biases (float32): the router's [E], gate's and up's [E, F], down's [E, dim]
    biases: tuple[Any, Any, Any, Any] | None = None

    @property
    def arrays(self) -> list[Any]:
        matrices = (a for m in (self.gate, self.up, self.down) for a in m.arrays)
        return [self.router, *matrices, *(self.biases or ())]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)

    @property
    def quantized(self) -> bool:
        return any(m.quantized for m in (self.gate, self.up, self.down))


def place_experts(moe: MoEWeights, quantized: bool, dtype: np.dtype[Any]) -> MLXExperts:
    """The experts as MLX arrays: kept quantized where their type is in BITS (unless
    `quantized` is false), else expanded to `dtype`; the router in float32."""
    gate, up, down = (_stack(m, quantized, dtype) for m in (moe.gate, moe.up, moe.down))
    router = mx.array(np.asarray(moe.router, dtype=np.float32))
    extra = moe.gpt_oss
    if extra is None:
        return MLXExperts(router, gate, up, down, moe.top_k)
    r, g, u, d = (
        mx.array(np.asarray(b, dtype=np.float32))
        for b in (extra.router_bias, extra.gate_bias, extra.up_bias, extra.down_bias)
    )
    return MLXExperts(router, gate, up, down, moe.top_k, (r, g, u, d))


def _stack(m: ExpertMatrix, quantized: bool, dtype: np.dtype[Any]) -> ExpertStack:
    """One expert at a time, so the temporaries stay one expert's size."""
    e, n, bits = m.num_experts, m.n, BITS.get(m.qtype)
    if not quantized or bits is None or m.k % GROUP:
        dense = np.empty((e, n, m.k), dtype=dtype)
        for i in range(e):
            dense[i] = m.dense(i)
        return ExpertStack(mx.array(dense), m.qtype.name)
    wq = np.empty((e, n, m.k * bits // 32), dtype=np.uint32)
    scales, biases = (np.empty((e, n, m.k // GROUP), dtype=dtype) for _ in range(2))
    for i in range(e):
        d = decode(m.data[i], m.qtype)
        wq[i], scales[i], biases[i] = pack(d.codes, bits), d.scale, d.offset
    quant = MLXQuant(mx.array(wq), mx.array(scales), mx.array(biases), bits)
    return ExpertStack(quant, m.qtype.name)


def route(logits: Any, top_k: int) -> tuple[Any, Any]:
    """Each row's top_k experts by descending probability (ties: the lower index first,
    as MLX's argsort keeps equal keys in index order) and their weights renormalised over
    the k, summed in rank order: ([N, k] uint32, [N, k] float32)."""
    probs = mx.softmax(logits.astype(mx.float32), axis=-1, precise=True)  # [N, E]
    experts = mx.argsort(-probs, axis=-1)[:, :top_k]
    chosen = mx.take_along_axis(probs, experts, axis=-1)  # [N, k]
    total = chosen[:, 0]
    for j in range(1, top_k):
        total = total + chosen[:, j]
    return experts, chosen / total[:, None]


def route_top_logits(logits: Any, top_k: int) -> tuple[Any, Any]:
    """gpt-oss's routing (engine/ops/moe.py's): the top_k by raw logit, weighted by the
    softmax of those k summed in rank order."""
    experts = mx.argsort(-logits, axis=-1)[:, :top_k]
    chosen = mx.take_along_axis(logits, experts, axis=-1)
    e = mx.exp(chosen - chosen[:, :1])
    total = e[:, 0]
    for j in range(1, top_k):
        total = total + e[:, j]
    return experts, e / total[:, None]


def swiglu_oai(gate: Any, up: Any) -> Any:
    """gpt-oss's clamped SwiGLU (engine/ops/moe.py's)."""
    alpha, limit = float(SWIGLU_ALPHA), float(SWIGLU_LIMIT)
    x = mx.minimum(gate, limit)
    y = mx.clip(up, -limit, limit)
    return x * mx.sigmoid(alpha * x) * (y + 1)


def moe_ffn(x: Any, moe: MLXExperts) -> Any:
    """The experts' output [N, dim] for x [N, dim] (normed), without the residual."""
    n, k = x.shape[0], moe.top_k
    if n == 0:  # nothing to route (MLX's CPU build dies on some zero-row quantized products)
        return mx.zeros_like(x)
    logits = x.astype(mx.float32) @ moe.router.T
    b = moe.biases
    experts, weights = route(logits, k) if b is None else route_top_logits(logits + b[0], k)
    rows = x[:, None, None, :]  # [N, 1, 1, dim]: each row against its k experts
    gate, up = moe.gate.gather(rows, experts), moe.up.gather(rows, experts)  # [N, k, 1, F]
    if b is None:
        hidden = gate * mx.sigmoid(gate) * up
    else:
        hidden = swiglu_oai(gate + b[1][experts][:, :, None], up + b[2][experts][:, :, None])
    out = moe.down.gather(hidden, experts)[:, :, 0, :]  # [N, k, dim]
    if b is not None:
        out = out + b[3][experts]
    acc = weights[:, 0:1] * out[:, 0]
    for j in range(1, k):  # in the row's rank order
        acc = acc + weights[:, j : j + 1] * out[:, j]
    return acc.astype(x.dtype)
