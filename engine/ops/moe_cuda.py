"""The mixture-of-experts FFN of a step on CuPy, nothing read back to the host: the router's
product by the quantized-product kernel (its float32 form: a row's routing is its own, as
cuBLAS's product would not promise), the CPU's routing functions (engine/ops/moe.py) on the
device's arrays, the pairs grouped by expert
and cut into tiles there too (quant/cuda_experts.py), each of the three products of every
(row, expert) pair in one launch, and gpt-oss's biases, its clamped SwiGLU and the weighing
as CuPy expressions. A pair's product is its row's with its expert's matrix whatever else is
in the step, and a row's k outputs are added in its own ranking order: a row's bits do not
depend on the batch. With no read back, a decode step can be a CUDA graph
(engine/decode_graphs.py). The counters count calls only on CUDA (experts touched and
bytes read would need a read back a layer), and not a replayed graph's.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from engine.ops.kernels import matmul_t
from engine.ops.moe import buckets, route, route_top_logits, swiglu_oai, weigh
from engine.ops.quant.cuda import GpuQuantMatrix
from engine.ops.quant.cuda_experts import GpuExperts, grouped_matmul_t, tile_plan
from engine.ops.quant.experts import GptOssExperts, MoEWeights

Array = Any  # cupy.ndarray


@dataclass(frozen=True, slots=True)
class CudaExperts:
    """One layer's experts in GPU memory (MoEWeights' fields there)."""

    router: GpuQuantMatrix  # [E, dim] float32
    gate: GpuExperts  # [E, expert_ffn, dim]
    up: GpuExperts
    down: GpuExperts  # [E, dim, expert_ffn]
    top_k: int
    stats: np.ndarray  # MoEWeights.stats: its calls only (see above)
    gpt_oss: GptOssExperts | None  # its biases in GPU memory

    @classmethod
    def upload(cls, moe: MoEWeights, xp: ModuleType) -> CudaExperts:
        extra = moe.gpt_oss
        if extra is not None:
            parts = (extra.router_bias, extra.gate_bias, extra.up_bias, extra.down_bias)
            extra = GptOssExperts(*(xp.asarray(a, dtype=np.float32) for a in parts))
        gate, up, down = (GpuExperts.upload(m, xp) for m in (moe.gate, moe.up, moe.down))
        router = np.asarray(moe.router, np.float32)  # [E, dim]: dim a multiple of 32, as
        # the experts' quantized blocks along it need
        gpu_router = GpuQuantMatrix.of_float32(router, router.shape[1], xp)
        return cls(gpu_router, gate, up, down, moe.top_k, moe.stats, extra)

    @property
    def num_experts(self) -> int:
        return int(self.router.shape[0])

    @property
    def nbytes(self) -> int:
        extra = self.gpt_oss.nbytes if self.gpt_oss is not None else 0
        matrices = self.gate.nbytes + self.up.nbytes + self.down.nbytes
        return int(self.router.nbytes) + matrices + extra


def moe_ffn_cuda(x: Array, moe: CudaExperts, xp: ModuleType) -> Array:
    """The experts' output [N, dim] for x [N, dim] (normed), without the residual."""
    k, extra = moe.top_k, moe.gpt_oss
    x = xp.ascontiguousarray(x, dtype=np.float32)
    logits = matmul_t(x, moe.router)  # the kernel's, not the BLAS's: batch invariant
    if extra is not None:
        logits += extra.router_bias
    experts, weights = (route if extra is None else route_top_logits)(logits, k, xp)
    order, starts = buckets(experts, moe.num_experts, xp)
    tiles = tile_plan(starts, len(order), xp)
    rows = order // k  # each pair's activation row, in bucket order
    gate, up = grouped_matmul_t(x, moe.gate, rows, tiles), grouped_matmul_t(x, moe.up, rows, tiles)
    if extra is None:
        hidden = gate / (np.float32(1) + xp.exp(-gate)) * up
    else:
        chosen = experts.reshape(-1)[order]  # each pair's expert
        gate += extra.gate_bias[chosen]
        up += extra.up_bias[chosen]
        hidden = swiglu_oai(gate, up, xp)
    down = grouped_matmul_t(hidden, moe.down, xp.arange(len(order), dtype=np.int64), tiles)
    if extra is not None:
        down += extra.down_bias[chosen]
    moe.stats[0] += 1
    return weigh(down, order, weights, xp)
