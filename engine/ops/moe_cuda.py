"""The mixture-of-experts FFN of a step on CuPy: the CPU's routing (engine/ops/moe.py's own
functions, on the router's logits copied to the host: N x E floats), then each of the
three products of every (row, expert) pair in one launch (quant/cuda_experts.py), and
gpt-oss's biases, its clamped SwiGLU and the weighing as CuPy expressions. A pair's product
is its row's with its expert's matrix whatever else is in the step, and a row's k outputs
are added in its own ranking order: a row's bits do not depend on the batch.

The copy to the host makes the step wait for the router, once a layer: an eager step. A
captured decode graph (engine/decode_graphs.py) would need the routing on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from engine.ops.moe import buckets, route, route_top_logits, swiglu_oai, weigh
from engine.ops.quant.cuda_experts import GpuExperts, grouped_matmul_t, tile_plan
from engine.ops.quant.experts import GptOssExperts, MoEWeights

Array = Any  # cupy.ndarray (numpy.ndarray in the unit test of the routing around the kernel)
# (x [R, K], experts, pair_rows [P], tiles [3, T]) -> [P, N]: grouped_matmul_t
Product = Callable[[Array, Any, Array, Array], Array]


@dataclass(frozen=True, slots=True)
class CudaExperts:
    """One layer's experts in GPU memory (MoEWeights' fields there)."""

    router: Array  # [E, dim] float32
    gate: GpuExperts  # [E, expert_ffn, dim]
    up: GpuExperts
    down: GpuExperts  # [E, dim, expert_ffn]
    top_k: int
    stats: np.ndarray  # MoEWeights.stats: counted on the host
    gpt_oss: GptOssExperts | None  # its biases in GPU memory

    @classmethod
    def upload(cls, moe: MoEWeights, xp: ModuleType) -> CudaExperts:
        extra = moe.gpt_oss
        if extra is not None:
            parts = (extra.router_bias, extra.gate_bias, extra.up_bias, extra.down_bias)
            extra = GptOssExperts(*(xp.asarray(a, dtype=np.float32) for a in parts))
        gate, up, down = (GpuExperts.upload(m, xp) for m in (moe.gate, moe.up, moe.down))
        router = xp.asarray(moe.router, dtype=np.float32)
        return cls(router, gate, up, down, moe.top_k, moe.stats, extra)

    @property
    def num_experts(self) -> int:
        return int(self.router.shape[0])

    @property
    def nbytes(self) -> int:
        extra = self.gpt_oss.nbytes if self.gpt_oss is not None else 0
        matrices = self.gate.nbytes + self.up.nbytes + self.down.nbytes
        return int(self.router.nbytes) + matrices + extra


def moe_ffn_cuda(
    x: Array, moe: CudaExperts, xp: ModuleType, product: Product = grouped_matmul_t
) -> Array:
    """The experts' output [N, dim] for x [N, dim] (normed), without the residual."""
    k, extra = moe.top_k, moe.gpt_oss
    x = xp.ascontiguousarray(x, dtype=np.float32)
    logits = x @ moe.router.T
    if extra is not None:
        logits += extra.router_bias
    host = logits if xp is np else xp.asnumpy(logits)  # the one wait for the device
    experts, weights = (route if extra is None else route_top_logits)(host, k)
    order, starts = buckets(experts, moe.num_experts)
    by_expert = experts.reshape(-1)[order]
    tiles = xp.asarray(tile_plan(starts))
    rows = xp.asarray(order // k)  # each pair's activation row, in bucket order
    gate, up = product(x, moe.gate, rows, tiles), product(x, moe.up, rows, tiles)
    if extra is None:
        hidden = gate / (np.float32(1) + xp.exp(-gate)) * up
    else:
        chosen = xp.asarray(by_expert)
        gate += extra.gate_bias[chosen]
        up += extra.up_bias[chosen]
        hidden = swiglu_oai(gate, up, xp)
    down = product(hidden, moe.down, xp.arange(len(order), dtype=np.int64), tiles)
    if extra is not None:
        down += extra.down_bias[chosen]
    touched = int(np.count_nonzero(np.diff(starts)))
    read = touched * sum(w.expert_bytes for w in (moe.gate, moe.up, moe.down))
    moe.stats[:] += (1, touched, read)
    return weigh(down, xp.asarray(order), xp.asarray(weights), xp)
